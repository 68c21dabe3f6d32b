import type { BatchOp, Collection, Store } from '../store/index.js'
import { randomBase62 } from '../util/random.js'

/**
 * An agent's committed spend over a trailing window, as the spend_rate rule reads it. The
 * metrics feature keeps per-agent minute buckets too; this interface is the seam to read
 * those instead of `MinuteSpend`.
 */
export interface SpendWindow {
  /**
   * Base units paid by `agentId` in the minute buckets that start after `fromMs` and at or before
   * `toMs` (to the minute, as usage.ts counts rate windows). With `asOf`, its writer's bucket of
   * its minute counts as it stood then (read now, it may hold later payments of that minute).
   */
  spent(agentId: string, fromMs: number, toMs: number, asOf?: MinuteAsOf): Promise<bigint>
}

/** One writer's total of one minute at a moment: a payment's own minute, this payment included (`MinuteSpend.asOf`). */
export interface MinuteAsOf {
  writer: string
  minute: number
  units: bigint
}

const MINUTE_MS = 60_000
/** 24 h (the longest window) plus the minute a window's start falls in. */
const HORIZON_MS = 24 * 60 * MINUTE_MS + MINUTE_MS

const minuteKey = (minute: number): string => minute.toString(36).padStart(9, '0')
const keyOf = (agentId: string, minute: number, writer = ''): string => `${agentId}\u0000${minuteKey(minute)}${writer ? `\u0000${writer}` : ''}`
/** Past every writer suffix of a minute's keys. */
const AFTER_WRITERS = '\u0000\uffff'

/**
 * Per-agent minute buckets of paid amounts, kept by the notifications record hook in the
 * same write as each paid record (so they never disagree with the records after a crash),
 * held in memory and loaded once at start. One small key per agent and minute: a payment
 * writes its minute's total, and a new minute deletes the buckets past 24 h.
 *
 * Replicas on one database: each process writes its own buckets (the key ends with a writer id
 * of its own, so no replica overwrites another's total) and `spent` sums every writer's from
 * the store. Buckets of stopped writers past 24 h are deleted by `sweep` (hourly).
 */
export class MinuteSpend implements SpendWindow {
  private readonly coll: Collection<string>
  private readonly byAgent = new Map<string, Map<number, bigint>>()
  /** Replicas: this process's part of its keys; '' on LevelDB. */
  private readonly writer: string

  constructor(private readonly store: Store) {
    this.coll = store.collection('notifySpend')
    this.writer = store.backend === 'postgres' ? randomBase62(8) : ''
  }

  async load(): Promise<void> {
    if (this.writer) return // replicas: nothing is this process's yet, and `spent` reads the store
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
        ops.push({ type: 'del', coll: this.coll as Collection<unknown>, key: keyOf(agentId, b, this.writer) })
      }
    }
    const total = (m.get(minute) ?? 0n) + units
    m.set(minute, total)
    const latest = (): string => (this.byAgent.get(agentId)?.get(minute) ?? total).toString()
    ops.push({ type: 'put', coll: this.coll as Collection<unknown>, key: keyOf(agentId, minute, this.writer), value: total.toString(), latest })
    return ops
  }

  /** This process's total of the minute of `at`, as it stands now (right after `add`: that payment's own minute). */
  asOf(agentId: string, at: number): MinuteAsOf {
    const minute = at - (at % MINUTE_MS)
    return { writer: this.writer, minute, units: this.byAgent.get(agentId)?.get(minute) ?? 0n }
  }

  /** This process's buckets of a deleted agent (all of them on LevelDB; with replicas see `forgetAll`). */
  forget(agentId: string): BatchOp[] {
    const m = this.byAgent.get(agentId)
    this.byAgent.delete(agentId)
    return [...(m?.keys() ?? [])].map((b): BatchOp => ({ type: 'del', coll: this.coll as Collection<unknown>, key: keyOf(agentId, b, this.writer) }))
  }

  /** A deleted agent's buckets: with replicas every writer's, read from the store. */
  async forgetAll(agentId: string): Promise<BatchOp[]> {
    const own = this.forget(agentId)
    if (!this.writer) return own
    const ops: BatchOp[] = []
    for await (const key of this.coll.keys({ gt: `${agentId}\u0000`, lt: `${agentId}\u0001` })) ops.push({ type: 'del', coll: this.coll as Collection<unknown>, key })
    return ops
  }

  async spent(agentId: string, fromMs: number, toMs: number, asOf?: MinuteAsOf): Promise<bigint> {
    if (this.writer) return this.spentShared(agentId, fromMs, toMs, asOf)
    let n = 0n
    for (const [b, u] of this.byAgent.get(agentId) ?? []) if (b > fromMs && b <= toMs) n += asOf && b === asOf.minute && asOf.writer === '' ? asOf.units : u
    return n
  }

  /** Replicas: every writer's buckets in the window, from the store. */
  private async spentShared(agentId: string, fromMs: number, toMs: number, asOf?: MinuteAsOf): Promise<bigint> {
    const from = fromMs - (fromMs % MINUTE_MS)
    const to = toMs - (toMs % MINUTE_MS)
    let n = 0n
    // Buckets start on minutes: one after `fromMs` starts after its minute, and `toMs`'s minute is in.
    for await (const [key, units] of this.coll.entries({ gt: keyOf(agentId, from) + AFTER_WRITERS, lte: keyOf(agentId, to) + AFTER_WRITERS })) {
      const b = Number.parseInt(key.slice(agentId.length + 1, agentId.length + 10), 36)
      if (!(b > fromMs && b <= toMs)) continue
      n += asOf && b === asOf.minute && key.slice(agentId.length + 11) === asOf.writer ? asOf.units : BigInt(units)
    }
    return n
  }

  /** Replicas: delete every writer's buckets past 24 h (a stopped writer never prunes its own); the number deleted. */
  async sweep(now: number): Promise<number> {
    if (!this.writer) return 0
    const ops: BatchOp[] = []
    for await (const key of this.coll.keys()) {
      const parts = key.split('\u0000')
      const b = Number.parseInt(parts[parts.length - 2] ?? '', 36)
      if (b <= now - HORIZON_MS) ops.push({ type: 'del', coll: this.coll as Collection<unknown>, key })
      if (ops.length >= 1000) break
    }
    if (ops.length) await this.store.batch(ops)
    return ops.length
  }
}
