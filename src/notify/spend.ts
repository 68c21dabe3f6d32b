import type { BatchOp, Collection, Store } from '../store/index.js'

/**
 * An agent's committed spend over a trailing window, as the spend_rate rule reads it. The
 * metrics feature keeps per-agent minute buckets too; this interface is the seam to read
 * those instead of `MinuteSpend`.
 */
export interface SpendWindow {
  /** Base units paid by `agentId` in the minute buckets that start after `fromMs` and at or before `toMs` (to the minute, as usage.ts counts rate windows). */
  spent(agentId: string, fromMs: number, toMs: number): Promise<bigint>
}

const MINUTE_MS = 60_000
/** 24 h (the longest window) plus the minute a window's start falls in. */
const HORIZON_MS = 24 * 60 * MINUTE_MS + MINUTE_MS

type Buckets = [minuteStart: number, units: string][]

/**
 * Per-agent minute buckets of paid amounts, kept by the notifications record hook in the
 * same write as each paid record (so they never disagree with the records after a crash),
 * held in memory and loaded once at start.
 */
export class MinuteSpend implements SpendWindow {
  private readonly coll: Collection<Buckets>
  private readonly byAgent = new Map<string, Buckets>()

  constructor(store: Store) {
    this.coll = store.collection('notifySpend')
  }

  async load(): Promise<void> {
    for await (const [agentId, b] of this.coll.entries()) this.byAgent.set(agentId, b)
  }

  /** Count a payment at `at` (synchronous: runs inside the record hook); the op writes the newest buckets when logged. */
  add(agentId: string, at: number, units: bigint): BatchOp {
    const start = at - (at % MINUTE_MS)
    const kept = (this.byAgent.get(agentId) ?? []).filter(([b]) => b > at - HORIZON_MS)
    const last = kept[kept.length - 1]
    if (last && last[0] === start) kept[kept.length - 1] = [start, (BigInt(last[1]) + units).toString()]
    else kept.push([start, units.toString()])
    this.byAgent.set(agentId, kept)
    return { type: 'put', coll: this.coll as Collection<unknown>, key: agentId, value: kept, latest: () => this.byAgent.get(agentId) ?? kept }
  }

  forget(agentId: string): BatchOp {
    this.byAgent.delete(agentId)
    return { type: 'del', coll: this.coll as Collection<unknown>, key: agentId }
  }

  spent(agentId: string, fromMs: number, toMs: number): Promise<bigint> {
    let n = 0n
    for (const [b, u] of this.byAgent.get(agentId) ?? []) if (b > fromMs && b <= toMs) n += BigInt(u)
    return Promise.resolve(n)
  }
}
