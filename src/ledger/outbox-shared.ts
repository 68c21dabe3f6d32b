import type { Logger } from '../log/index.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { NONCE_KEY, nonceKey, type OutboxEntry } from './outbox-receipts.js'

/** Another replica's row still unconfirmed this long after we first saw it is sent by us too. */
const ADOPT_AFTER_MS = 30_000

/**
 * The outbox's half for a store shared by replicas (PostgreSQL), where every replica records with
 * the one ledger signer: nonces are taken from the database under its cross-replica lock, in the
 * batch that stores the records, and a replica also sends other replicas' rows it finds left
 * unsent (see adoptable). The Outbox keeps the held records; this keeps what only replicas need.
 */
export class SharedOutbox {
  /** The signer's nonce on chain at start: the floor for the stored next nonce. */
  chainNonce = 0n
  /** Other replicas' rows below our own, and when we first saw each. */
  private foreignSeen = new Map<string, number>()

  constructor(
    private readonly store: Store,
    private readonly entries: Collection<OutboxEntry>,
    private readonly meta: Collection<string>,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {}

  /**
   * Take the nonces from the database under the signer's cross-replica lock, written in that lock's
   * transaction: records whose `still` says no are dropped first, and `sign` adds the kept ones
   * (from the stored next nonce) to `batch`, returning the next nonce.
   */
  async record<R extends { still?: () => Promise<boolean> }>(group: readonly R[], batch: BatchOp[], sign: (kept: R[], from: bigint) => Promise<bigint>): Promise<{ next: bigint; kept: R[] }> {
    const { result, written } = await this.store.transact('ledger:signer', async () => {
      const kept: R[] = []
      for (const g of group) if (!g.still || (await g.still())) kept.push(g)
      const at = await this.meta.get(NONCE_KEY)
      const from = at !== undefined && BigInt(at) > this.chainNonce ? BigInt(at) : this.chainNonce
      const next = await sign(kept, from)
      return { ops: batch, result: { next, kept } }
    })
    const w = await written
    if (!w.ok) throw w.error
    return result
  }

  /**
   * Rows of other replicas below our first held one (`unconfirmed`, then `unsent`), still stored
   * ADOPT_AFTER_MS after we first saw them, were left by a replica that stopped (or cannot reach
   * the chain). Our later nonces cannot be mined before them, so the Outbox sends them too (a
   * signed transaction sent twice is harmless) and confirms them like its own: returned in nonce
   * order, at most `limit`.
   */
  async adoptable(unconfirmed: readonly OutboxEntry[], unsent: readonly OutboxEntry[], limit: number): Promise<OutboxEntry[]> {
    const first = unconfirmed[0] ?? unsent[0]
    if (!first) return []
    const now = this.clock.now()
    const ours = new Set([...unconfirmed, ...unsent].map((e) => e.nonce))
    const seen = new Map<string, number>()
    const adopt: OutboxEntry[] = []
    for await (const [, e] of this.entries.entries({ lt: nonceKey(BigInt(first.nonce)), limit })) {
      if (ours.has(e.nonce)) continue
      const since = this.foreignSeen.get(e.nonce) ?? now
      seen.set(e.nonce, since)
      if (now - since >= ADOPT_AFTER_MS) adopt.push(e)
    }
    this.foreignSeen = seen
    if (!adopt.length) return adopt
    this.log.warn({ from: adopt[0]!.nonce, count: adopt.length }, 'sending ledger records another replica left unsent or unconfirmed')
    for (const e of adopt) this.foreignSeen.delete(e.nonce)
    return adopt
  }
}
