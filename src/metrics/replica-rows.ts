import type { Collection, Store } from '../store/index.js'
import { type AgentBuckets, ALL, newBuckets } from './agent-buckets.js'
import { accountKey, agentRange, type Level, parseBucketKey, readAccount, readBuckets } from './bucket-store.js'
import { mergeInto, type Bucket, type StoredBucket } from './buckets.js'
import { DAY_MS, floorTo, HOUR_MS, MINUTE_MS, type Span } from './windows.js'

/**
 * The aggregates on a store shared by replicas (PostgreSQL). Each replica writes only rows of
 * its own, its keys prefixed with its replica id (`<replicaId>\0<key as on LevelDB>`), so the
 * buckets it keeps in memory are exactly what its rows hold and its contributor stays
 * synchronous, in the record's own write. The rows of stopped replicas are folded into the
 * base rows (`metricsAgg`, `metricsAccount`, keyed as on LevelDB; `fold.ts`), which also hold
 * what a backfill counted. A query reads the base rows and every replica's rows of its span
 * from the store and sums them: nothing another replica wrote is taken from memory.
 */
export const REPLICA_AGENTS = 'metricsAggReplica'
export const REPLICA_ACCOUNT = 'metricsAccountReplica'
/** Bumped in each fold's transaction: a query that saw it change re-reads (a fold moves rows between sources). */
export const FOLD_COLL = 'metricsFold'
export const FOLD_GEN_KEY = 'gen'
/** Re-reads of a query that a fold crossed, before it answers with the last (folds are rare). */
const RETRIES = 5

/** Where one writer's buckets are: the base rows (no prefix) or a replica's. */
export interface Rows {
  agents: Collection<StoredBucket>
  account: Collection<unknown>
  prefix: string
}

export const baseRows = (store: Store): Rows => ({ agents: store.collection('metricsAgg'), account: store.collection('metricsAccount'), prefix: '' })

export const replicaRows = (store: Store, replicaId: string): Rows => ({
  agents: store.collection(REPLICA_AGENTS),
  account: store.collection(REPLICA_ACCOUNT),
  prefix: `${replicaId}\x00`,
})

/** The replicas with rows in `coll` (one of the replica collections), found by skipping from one replica's keys to the next. */
export async function* replicaIdsIn(coll: Collection<unknown>): AsyncIterable<string> {
  let gte = ''
  for (;;) {
    let next: string | undefined
    for await (const key of coll.keys({ gte, limit: 1 })) next = key
    if (next === undefined) return
    const id = next.slice(0, next.indexOf('\x00'))
    yield id
    gte = `${id}\x01`
  }
}

export interface SpanRead {
  precision: Level
  from: number
  /** Exclusive. */
  to: number
}

/**
 * The bucket ranges `sumAgent` may read for `span`: the fine buckets (minutes, or hours for
 * hour precision) at the edges and the whole coarse ones (hours, or UTC days) between; every
 * fine bucket too when its series is finer than the coarse level or no coarse bucket fits.
 */
export function spanReads(span: Span): SpanRead[] {
  const [fine, coarse, fineMs, coarseMs]: [Level, Level, number, number] = span.precision === 'minute' ? ['minute', 'hour', MINUTE_MS, HOUR_MS] : ['hour', 'day', HOUR_MS, DAY_MS]
  const end = span.last + fineMs
  const first = Math.ceil(span.from / coarseMs) * coarseMs
  const endCoarse = floorTo(end, coarseMs)
  if (first >= endCoarse) return [{ precision: fine, from: span.from, to: end }]
  const between: SpanRead = { precision: coarse, from: first, to: endCoarse }
  if (span.step < coarseMs) return [{ precision: fine, from: span.from, to: end }, between]
  const edges: SpanRead[] = [
    { precision: fine, from: span.from, to: first },
    { precision: fine, from: endCoarse, to: end },
  ]
  return [edges[0]!, between, edges[1]!].filter((r) => r.to > r.from)
}

export const emptyView = (): AgentBuckets => newBuckets(ALL)

/** Add a bucket read from one source into the sum. */
export function addInto(into: AgentBuckets, precision: Level, start: number, b: Bucket): void {
  const m = precision === 'minute' ? into.minutes : precision === 'hour' ? into.hours : into.days
  const have = m.get(start)
  if (have) mergeInto(have, b, true)
  else m.set(start, b)
}

/** One source's buckets of `agentId` in the span's ranges, added into `into`. */
async function readAgentRows(rows: Rows, agentId: string, reads: SpanRead[], now: number, into: AgentBuckets): Promise<void> {
  const { prefix } = rows
  for (const r of reads) {
    const range = agentRange(agentId, r.precision, r.from, r.to)
    await readBuckets(
      null,
      rows.agents,
      { gte: prefix + range.gte, lt: prefix + range.lt },
      (key) => parseBucketKey(key.slice(prefix.length)),
      now,
      (p, start, b) => addInto(into, p, start, b),
    )
  }
}

/** One source's account buckets in the span's ranges (each with its endpoint and by-agent entries), added into `into`. */
async function readAccountRows(rows: Rows, reads: SpanRead[], now: number, into: AgentBuckets): Promise<void> {
  const { prefix } = rows
  for (const r of reads) {
    const range = { gte: prefix + accountKey(r.precision, r.from), lt: prefix + accountKey(r.precision, r.to) }
    await readAccount(null, rows.account, now, (p, start, b) => addInto(into, p, start, b), { range, prefix })
  }
}

/** Reads the sums over the base rows and every replica's rows, as the queries of one span need them. */
export class SharedReader {
  private readonly gen: Collection<number>

  constructor(private readonly store: Store) {
    this.gen = store.collection<number>(FOLD_COLL)
  }

  /** The agent's buckets summed over every writer, for `span` (at `now`: retention). */
  agent(agentId: string, span: Span, now: number): Promise<AgentBuckets> {
    const reads = spanReads(span)
    return this.consistent(REPLICA_AGENTS, (rows, into) => readAgentRows(rows, agentId, reads, now, into))
  }

  /** The account's buckets summed over every writer, for `span`. */
  account(span: Span, now: number): Promise<AgentBuckets> {
    const reads = spanReads(span)
    return this.consistent(REPLICA_ACCOUNT, (rows, into) => readAccountRows(rows, reads, now, into))
  }

  /**
   * Read every source into one sum; again when a fold committed meanwhile (its generation
   * changed), since a fold moves rows from a replica's to the base rows in one transaction
   * and a read across it could count them twice or not at all.
   */
  private async consistent(coll: string, read: (rows: Rows, into: AgentBuckets) => Promise<void>): Promise<AgentBuckets> {
    for (let i = 0; ; i++) {
      const before = await this.gen.get(FOLD_GEN_KEY)
      const sources = [baseRows(this.store)]
      for await (const id of replicaIdsIn(this.store.collection(coll))) sources.push(replicaRows(this.store, id))
      const into = emptyView()
      await Promise.all(sources.map((rows) => read(rows, into)))
      if ((await this.gen.get(FOLD_GEN_KEY)) === before || i >= RETRIES) return into
    }
  }
}
