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

const keyOf = (agentId: string, minute: number): string => `${agentId}\u0000${minute.toString(36).padStart(9, '0')}`

/**
 * Per-agent minute buckets of paid amounts, kept by the notifications record hook in the
 * same write as each paid record (so they never disagree with the records after a crash),
 * held in memory and loaded once at start. One small key per agent and minute: a payment
 * writes its minute's total, and a new minute deletes the buckets past 24 h.
 */
export class MinuteSpend implements SpendWindow {
  private readonly coll: Collection<string>
  private readonly byAgent = new Map<string, Map<number, bigint>>()

  constructor(store: Store) {
    this.coll = store.collection('notifySpend')
  }

  async load(): Promise<void> {
    for await (const [key, units] of this.coll.entries()) {
      const i = key.lastIndexOf('\u0000')
      const agentId = key.slice(0, i)
      let m = this.byAgent.get(agentId)
      if (!m) this.byAgent.set(agentId, (m = new Map()))
      m.set(Number.parseInt(key.slice(i + 1), 36), BigInt(units))
    }
  }

  /** Count a payment at `at` (synchronous: runs inside the record hook); the put writes the minute's newest total when logged. */
  add(agentId: string, at: number, units: bigint): BatchOp[] {
    const minute = at - (at % MINUTE_MS)
    let m = this.byAgent.get(agentId)
    if (!m) this.byAgent.set(agentId, (m = new Map()))
    const ops: BatchOp[] = []
    if (!m.has(minute)) {
      for (const b of m.keys()) {
        if (b > at - HORIZON_MS) continue
        m.delete(b)
        ops.push({ type: 'del', coll: this.coll as Collection<unknown>, key: keyOf(agentId, b) })
      }
    }
    const total = (m.get(minute) ?? 0n) + units
    m.set(minute, total)
    const latest = (): string => (this.byAgent.get(agentId)?.get(minute) ?? total).toString()
    ops.push({ type: 'put', coll: this.coll as Collection<unknown>, key: keyOf(agentId, minute), value: total.toString(), latest })
    return ops
  }

  forget(agentId: string): BatchOp[] {
    const m = this.byAgent.get(agentId)
    this.byAgent.delete(agentId)
    return [...(m?.keys() ?? [])].map((b): BatchOp => ({ type: 'del', coll: this.coll as Collection<unknown>, key: keyOf(agentId, b) }))
  }

  spent(agentId: string, fromMs: number, toMs: number): Promise<bigint> {
    let n = 0n
    for (const [b, u] of this.byAgent.get(agentId) ?? []) if (b > fromMs && b <= toMs) n += u
    return Promise.resolve(n)
  }
}
