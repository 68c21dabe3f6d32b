import type { Transactions } from '../ledger/transactions.js'
import type { Logger } from '../log/index.js'
import type { InvocationBook } from '../policy/invocations.js'
import type { InvocationRunner } from './runner.js'

/**
 * At start: invocations a previous run left open (a crash mid-invocation) close as
 * `interrupted`. Their tokens are dead already (tokens live in memory only), the cap holds are
 * released from the orchestrators' usage, and the payments they made stay as recorded: one
 * still unknown keeps its own hold in its payer's usage until the reconciler settles it.
 * Returns how many were closed.
 */
export async function closeInterrupted(book: InvocationBook, runner: InvocationRunner, transactions: Transactions): Promise<number> {
  // Shared by replicas: the others' open invocations are theirs while they live.
  if (book.isShared) return 0
  const left = await book.leftOpen()
  for (const rec of left) book.adopt(rec)
  // Pinned at once: the outbox may confirm their ledger records while they are being closed.
  for (const rec of left) {
    const root = await transactions.get(rec.rootTxId)
    if (root) transactions.pin(transactions.liveRecord(root.id) ?? root)
  }
  const ids = new Set(left.map((r) => r.id))
  // The outermost ones: closing them closes what is nested under them.
  for (const rec of left) if (!rec.parentId || !ids.has(rec.parentId)) await runner.close(rec.id, 'interrupted')
  return left.length
}

/**
 * Shared by replicas (on each reconciler pass): invocations whose replica is gone (lease expired
 * or ended) close as `interrupted`, the outermost of each tree first, by whichever replica gets
 * there first (the close runs under the tree's lock; a second finds it closed).
 */
export async function closeOrphaned(book: InvocationBook, runner: InvocationRunner, log: Logger): Promise<number> {
  const left = await book.orphans()
  const ids = new Set(left.map((r) => r.id))
  for (const rec of left) if (!rec.parentId || !ids.has(rec.parentId)) await runner.close(rec.id, 'interrupted')
  if (left.length) log.warn({ invocations: left.length }, 'closed invocations of a replica that stopped as interrupted')
  return left.length
}
