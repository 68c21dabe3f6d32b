import type { Transactions, TxRecord } from '../ledger/transactions.js'
import { MAX_DEPTH, MAX_TREE_NODES } from '../ledger/trees.js'
import type { InvocationRecord } from '../policy/invocations.js'
import { usdc } from '../util/money.js'

/**
 * What invocations and runs cost now, read from their transactions rather than from the
 * invocation record: the record's `spent`/`chain`/`pending` are written at the close, and a
 * payment still in flight then (an invocation that timed out) settles later without touching
 * it. Read the way `GET /v1/transactions/<tx>/tree` reads a tree (the parent index, level by
 * level), so a run, its invocations and their trees always agree.
 */

/** The payments of an invocation's subtree (nested invocations' included): paid, and not yet settled. */
export interface Subtree {
  paid: TxRecord[]
  unsettled: TxRecord[]
}

const UNSETTLED = new Set(['pending', 'unknown'])

/** The payments under the invocation root `rootTxId`, at any depth (bounded as trees are). */
export async function subtreeOf(transactions: Transactions, rootTxId: string): Promise<Subtree> {
  const out: Subtree = { paid: [], unsettled: [] }
  const root = transactions.liveRecord(rootTxId) ?? (await transactions.get(rootTxId))
  let level = root ? [root] : []
  let nodes = 0
  for (let depth = 1; level.length && depth <= MAX_DEPTH && nodes < MAX_TREE_NODES; depth++) {
    const ids = await Promise.all(level.map((r) => transactions.childIdsOf(r)))
    const next: TxRecord[] = []
    for (const child of await transactions.getMany(ids.flat())) {
      if (!child || ++nodes > MAX_TREE_NODES) continue
      if (child.kind !== 'invocation') {
        // Rejected and failed payments moved no money and have nothing under them.
        if (child.status === 'paid') out.paid.push(child)
        else if (UNSETTLED.has(child.status)) out.unsettled.push(child)
        else continue
      }
      next.push(child)
    }
    level = next
  }
  return out
}

/** An invocation's cost as its answers show it, from its subtree as it stands. */
export function costFrom(rec: InvocationRecord, sub: Subtree): { totalCost: { usdc: number }; paymentChain: string[]; pendingCost?: { usdc: number } } {
  const total = sub.paid.reduce((a, r) => a + BigInt(r.amount), 0n)
  const pending = sub.unsettled.reduce((a, r) => a + BigInt(r.amount), 0n)
  // Commit order: the chain as the invocation recorded it, then what settled after its close.
  const known = new Set(rec.chain)
  const late = sub.paid
    .filter((r) => r.txHash && !known.has(r.txHash))
    .sort((a, b) => a.updatedAt - b.updatedAt)
    .map((r) => r.txHash!)
  const paidHashes = new Set(sub.paid.map((r) => r.txHash))
  return { totalCost: usdc(total), paymentChain: [...rec.chain.filter((h) => paidHashes.has(h)), ...late], ...(pending > 0n ? { pendingCost: usdc(pending) } : {}) }
}
