import type { RecordContributor } from '../ledger/record-hooks.js'
import type { Transactions, TxRecord } from '../ledger/transactions.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { addPaid, addRejected, decodeBucket, emptyBucket, encodeBucket, endpointKey, mergeInto, type Bucket, type StoredBucket } from './buckets.js'
import { deltasOf, deltasOfRecord, type Delta } from './deltas.js'
import { DAY_MS, floorTo, HOUR_MS, HOUR_RETENTION_MS, kept, MINUTE_MS, sizeOf, type Precision } from './windows.js'

/** Bump when what a bucket holds changes: a store whose aggregates are older is backfilled again. */
export const AGGREGATES_VERSION = 1
/** The `meta` entry holding the version the stored aggregates were built with. */
export const AGGREGATES_META_KEY = 'metricsAggregates'
/** Retention is enforced per agent at most this often (its minute buckets are walked). */
const PRUNE_EVERY_MS = 10 * MINUTE_MS
const CHUNK = 1000

export interface AgentBuckets {
  /** By bucket start (ms). */
  minutes: Map<number, Bucket>
  hours: Map<number, Bucket>
  /** The hours summed by UTC day, in memory only (rebuilt at load): long windows read days. */
  days: Map<number, Bucket>
  prunedAt: number
}

const NONE: readonly BatchOp[] = Object.freeze([])

/** A bucket's stored JSON with its maps in key order: equal counts compare equal whatever order they came in. */
function canonical(b: Bucket): string {
  const s = encodeBucket(b)
  const sorted = <T>(o: Record<string, T> | undefined) => (o ? Object.fromEntries(Object.entries(o).sort(([a], [c]) => (a < c ? -1 : a > c ? 1 : 0))) : undefined)
  return JSON.stringify({ ...s, r: sorted(s.r), e: sorted(s.e) })
}

/** `<agentId>\0m|h\0<start in buckets, base 36>`: sorted per agent and precision. */
export function bucketKey(agentId: string, precision: Precision, start: number): string {
  return `${agentId}\x00${precision === 'minute' ? 'm' : 'h'}\x00${(start / sizeOf(precision)).toString(36).padStart(8, '0')}`
}

export function parseBucketKey(key: string): { agentId: string; precision: Precision; start: number } | null {
  const j = key.lastIndexOf('\x00')
  const i = key.lastIndexOf('\x00', j - 1)
  if (i <= 0) return null
  const precision: Precision = key.slice(i + 1, j) === 'm' ? 'minute' : 'hour'
  return { agentId: key.slice(0, i), precision, start: Number.parseInt(key.slice(j + 1), 36) * sizeOf(precision) }
}

function applyDelta(b: Bucket, d: Delta, endpoint: string): void {
  if (d.kind === 'paid') addPaid(b, { amount: d.amount, protocol: d.protocol, latencyMs: d.latencyMs, endpoint })
  else if (d.kind === 'rejected') addRejected(b, d.reason)
  else if (d.kind === 'session') b.sessions++
  else b.delegated += d.amount
}

/**
 * Per-agent aggregates in minute buckets (kept 48 h) and hour buckets (kept 400 days), kept
 * by a record-hook contributor in the same write as each record, and held in memory so that
 * the contributor (synchronous) and the metrics API read them without touching the disk. The
 * store is the durable copy: loaded at start, or built once from the records when it has none
 * of this version. A write that fails after the contributor ran leaves memory ahead of the
 * store until the next start, which reloads it.
 */
export class Aggregates {
  readonly coll: Collection<StoredBucket>
  private readonly agents = new Map<string, AgentBuckets>()

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
  ) {
    this.coll = store.collection<StoredBucket>('metricsAgg')
  }

  /** The record-hook contributor: register with `gateway.hooks.add(aggregates.contributor)`. */
  readonly contributor: RecordContributor = (change) => {
    const deltas = deltasOf(change)
    if (!deltas.length) return NONE as BatchOp[]
    const ops: BatchOp[] = []
    const now = this.clock.now()
    for (const d of deltas) {
      this.apply(d, now, ops)
      this.prune(d.agentId, now, ops)
    }
    return ops
  }

  agentIds(): string[] {
    return [...this.agents.keys()]
  }

  agent(agentId: string): AgentBuckets | undefined {
    return this.agents.get(agentId)
  }

  private agentOf(agentId: string): AgentBuckets {
    let a = this.agents.get(agentId)
    if (!a) this.agents.set(agentId, (a = { minutes: new Map(), hours: new Map(), days: new Map(), prunedAt: 0 }))
    return a
  }

  private bucketOf(a: AgentBuckets, precision: Precision | 'day', start: number): Bucket {
    const m = precision === 'minute' ? a.minutes : precision === 'hour' ? a.hours : a.days
    let b = m.get(start)
    if (!b) m.set(start, (b = emptyBucket()))
    return b
  }

  /** Add `d` to its hour and minute buckets (those still kept), with their puts when `ops` is given. */
  private apply(d: Delta, now: number, ops?: BatchOp[]): void {
    const hourStart = floorTo(d.at, HOUR_MS)
    if (!kept('hour', hourStart, now)) return
    const a = this.agentOf(d.agentId)
    const hour = this.bucketOf(a, 'hour', hourStart)
    // The hour decides whether an endpoint is kept or folds into `other`, for its minutes too.
    const endpoint = d.kind === 'paid' ? endpointKey(hour, d.endpoint) : ''
    applyDelta(hour, d, endpoint)
    applyDelta(this.bucketOf(a, 'day', floorTo(d.at, DAY_MS)), d, endpoint)
    if (ops) ops.push(this.putOp(d.agentId, 'hour', hourStart, hour))
    const minuteStart = floorTo(d.at, MINUTE_MS)
    if (!kept('minute', minuteStart, now)) return
    const minute = this.bucketOf(a, 'minute', minuteStart)
    applyDelta(minute, d, endpoint)
    if (ops) ops.push(this.putOp(d.agentId, 'minute', minuteStart, minute))
  }

  /** The bucket's newest state is what gets logged (several changes in one tick write it once each, in order). */
  private putOp(agentId: string, precision: Precision, start: number, b: Bucket): BatchOp {
    return { type: 'put', coll: this.coll as Collection<unknown>, key: bucketKey(agentId, precision, start), value: true, latest: () => encodeBucket(b) }
  }

  /** Drop the agent's buckets past retention (memory and store), at most every PRUNE_EVERY_MS. */
  private prune(agentId: string, now: number, ops: BatchOp[]): void {
    const a = this.agents.get(agentId)
    if (!a || now - a.prunedAt < PRUNE_EVERY_MS) return
    a.prunedAt = now
    for (const [precision, m] of [
      ['minute', a.minutes],
      ['hour', a.hours],
    ] as const) {
      for (const start of m.keys()) {
        if (kept(precision, start, now)) continue
        m.delete(start)
        ops.push({ type: 'del', coll: this.coll as Collection<unknown>, key: bucketKey(agentId, precision, start) })
      }
    }
    for (const start of a.days.keys()) if (start + DAY_MS <= now - HOUR_RETENTION_MS) a.days.delete(start)
  }

  /** Add a record as it stands (a backfill or a recount). */
  addRecord(r: TxRecord, now: number): void {
    for (const d of deltasOfRecord(r)) this.apply(d, now)
  }

  /**
   * Load the stored aggregates, or, when the store has none of this version, build them from
   * the records (once: the version is written last, so an interrupted build starts over).
   * Call before the contributor is registered and before anything writes records.
   */
  async start(transactions: Transactions, meta: Collection<unknown>): Promise<{ backfilled: number | null; buckets: number }> {
    const now = this.clock.now()
    if ((await meta.get(AGGREGATES_META_KEY)) === AGGREGATES_VERSION) return { backfilled: null, buckets: await this.load(now) }
    await this.clear()
    let n = 0
    for await (const [, r] of transactions.records.entries()) {
      this.addRecord(r, now)
      n++
    }
    const buckets = await this.writeAll()
    await this.store.batch([{ type: 'put', coll: meta, key: AGGREGATES_META_KEY, value: AGGREGATES_VERSION }])
    return { backfilled: n, buckets }
  }

  private async load(now: number): Promise<number> {
    let n = 0
    const stale: BatchOp[] = []
    for await (const [key, value] of this.coll.entries()) {
      const k = parseBucketKey(key)
      if (!k) continue
      if (!kept(k.precision, k.start, now)) {
        stale.push({ type: 'del', coll: this.coll as Collection<unknown>, key })
        if (stale.length >= CHUNK) await this.store.batch(stale.splice(0))
        continue
      }
      const a = this.agentOf(k.agentId)
      const b = decodeBucket(value)
      if (k.precision === 'minute') a.minutes.set(k.start, b)
      else {
        a.hours.set(k.start, b)
        mergeInto(this.bucketOf(a, 'day', floorTo(k.start, DAY_MS)), b, true)
      }
      n++
    }
    if (stale.length) await this.store.batch(stale)
    return n
  }

  private async clear(): Promise<void> {
    let ops: BatchOp[] = []
    for await (const key of this.coll.keys()) {
      ops.push({ type: 'del', coll: this.coll as Collection<unknown>, key })
      if (ops.length >= CHUNK) {
        await this.store.batch(ops)
        ops = []
      }
    }
    if (ops.length) await this.store.batch(ops)
  }

  private async writeAll(): Promise<number> {
    let n = 0
    let ops: BatchOp[] = []
    for (const [agentId, a] of this.agents) {
      for (const [precision, m] of [
        ['minute', a.minutes],
        ['hour', a.hours],
      ] as const) {
        for (const [start, b] of m) {
          ops.push({ type: 'put', coll: this.coll as Collection<unknown>, key: bucketKey(agentId, precision, start), value: encodeBucket(b) })
          n++
          if (ops.length >= CHUNK) {
            await this.store.batch(ops)
            ops = []
          }
        }
      }
    }
    if (ops.length) await this.store.batch(ops)
    return n
  }

  /** Every bucket as stored JSON text, by key: what a recount is compared with. */
  snapshot(): Map<string, string> {
    const out = new Map<string, string>()
    for (const [agentId, a] of this.agents) {
      for (const [start, b] of a.minutes) out.set(bucketKey(agentId, 'minute', start), canonical(b))
      for (const [start, b] of a.hours) out.set(bucketKey(agentId, 'hour', start), canonical(b))
    }
    return out
  }
}

/** The aggregates a fresh count of every record gives (sessions are not records: not in it). */
export async function recount(store: Store, transactions: Transactions, clock: Clock): Promise<Map<string, string>> {
  const fresh = new Aggregates(store, clock)
  const now = clock.now()
  for await (const [, r] of transactions.records.entries()) fresh.addRecord(r, now)
  return fresh.snapshot()
}
