import type { RecordContributor } from '../ledger/record-hooks.js'
import type { Transactions, TxRecord } from '../ledger/transactions.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { accountValues, bucketKey, clear, keptLevel, type Level, writeValues } from './bucket-store.js'
import { canonical, encodeBucket, endpointKey, type Bucket, type StoredBucket } from './buckets.js'
import { type AgentBuckets, ALL, bucketOf, newBuckets } from './agent-buckets.js'
import { accountBucketDels, accountBucketPuts, agentBucketPut } from './bucket-ops.js'
import { Checkpoints, DELTA_COLLECTION } from './checkpoints.js'
import { applyAccount, applyDelta, deltasOf, deltasOfRecord, type Delta } from './deltas.js'
import { DirtyBuckets } from './dirty-buckets.js'
import { accountBuckets, agentBuckets, loadRecent, readOlder } from './bucket-loading.js'
import { Folder, type FoldOptions, type Liveness } from './fold.js'
import { REPLICA_ACCOUNT, REPLICA_AGENTS, replicaRows, SharedReader, type Rows } from './replica-rows.js'
import { DAY_MS, floorTo, HOUR_MS, kept, MINUTE_MS, type Precision, type Span } from './windows.js'

export type { AgentBuckets } from './agent-buckets.js'
export { bucketKey, parseBucketKey } from './bucket-store.js'

/** Bump when what is stored changes: a store whose aggregates are older is backfilled again. 3: the account's buckets (its map entries under keys of their own). */
export const AGGREGATES_VERSION = 3
/** The `meta` entry holding the version the stored aggregates were built with. */
export const AGGREGATES_META_KEY = 'metricsAggregates'
/** Also set, to the version, once the base rows of a shared store were counted from its records (rows written before replicas had rows of their own are each one replica's view). */
export const SHARED_META_KEY = 'metricsAggregatesShared'
/** Retention is enforced per agent at most this often (its minute buckets are walked). */
const PRUNE_EVERY_MS = 10 * MINUTE_MS
/** The account's key prefix in `snapshot()` (agent ids cannot hold `:`). */
const ACCOUNT_SNAPSHOT = 'account:'

const NONE: readonly BatchOp[] = Object.freeze([])

/** A store shared by replicas: this replica's identity, the others' liveness, and a lock across them for long sections (`CrossLocks`). */
export interface SharedOptions extends Liveness {
  run<T>(name: string, fn: () => Promise<T>): Promise<T>
}

/**
 * Per-agent aggregates in minute buckets (kept 48 h) and hour buckets (kept 400 days), and the
 * account's sums of them in buckets of its own, kept by a record-hook contributor, and held in
 * memory so that the contributor (synchronous) and the metrics API read them without touching
 * the disk. The store is the durable copy: on LevelDB each record's write carries its deltas
 * as one small row and the buckets are written behind (`checkpoints.ts`); on a shared store
 * the buckets are written in the same write as each record. At start the
 * account's buckets and each agent's minutes and recent hours are read; an agent's older hours
 * are read when first needed (`ready`, `prepare`). A store without aggregates of this version
 * gets them built from its records. On a shared store a write that fails after the contributor
 * ran leaves memory ahead of the store until the next start, which reloads it (on LevelDB a
 * change is counted only once its write is logged).
 *
 * On a store shared by replicas (`shared`) memory holds only what this replica counted since
 * it started, written to rows of its own, and queries (`view`, `accountView`) sum every
 * replica's rows from the store (`replica-rows.ts`; docs/replicas.md).
 */
export class Aggregates {
  readonly coll: Collection<StoredBucket>
  readonly accountColl: Collection<unknown>
  private readonly agents = new Map<string, AgentBuckets>()
  readonly account: AgentBuckets = newBuckets(ALL)
  private readonly loading = new Map<string, Promise<void>>()
  private meta: Collection<unknown> | null = null
  /** Where the contributor writes: the base rows, or on a shared store this replica's own. */
  private readonly rows: Rows
  private readonly reader: SharedReader | null
  /** LevelDB: the buckets written behind the records (null on a shared store). */
  private readonly checkpoints: Checkpoints | null
  private readonly dirty = new DirtyBuckets()
  /** Told when writing the buckets behind fails (it is retried at the next checkpoint). */
  onCheckpointError: (e: unknown) => void = () => {}

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    private readonly shared: SharedOptions | null = null,
  ) {
    this.coll = store.collection<StoredBucket>('metricsAgg')
    this.accountColl = store.collection<unknown>('metricsAccount')
    this.rows = shared ? replicaRows(store, shared.replicaId) : { agents: this.coll, account: this.accountColl, prefix: '' }
    this.reader = shared ? new SharedReader(store) : null
    this.checkpoints = shared
      ? null
      : new Checkpoints(
          store,
          () => this.dirty.take(this.rows),
          (e) => this.onCheckpointError(e),
        )
  }

  /** The agent's buckets a query of `span` sums: from memory, or on a shared store every replica's from the store. */
  async view(agentId: string, span: Span): Promise<AgentBuckets | undefined> {
    if (this.reader) return this.reader.agent(agentId, span, this.clock.now())
    return this.ready(agentId, span.from, span.precision)
  }

  /** The account's buckets a query of `span` sums (as `view`). */
  async accountView(span: Span): Promise<AgentBuckets> {
    return this.reader ? this.reader.account(span, this.clock.now()) : this.account
  }

  /** On a shared store: fold the rows of stopped replicas into the base rows now and then (`fold.ts`); the returned stop waits for a running pass. */
  startFolding(onError: (e: unknown) => void, opts?: FoldOptions): () => Promise<void> {
    if (!this.shared) return async () => {}
    return new Folder(this.store, () => this.clock.now(), this.shared, opts).start(onError)
  }

  /** The record-hook contributor: register with `gateway.hooks.add(aggregates.contributor)`. */
  readonly contributor: RecordContributor = (change) => {
    const deltas = deltasOf(change)
    if (!deltas.length) return NONE as BatchOp[]
    const ops: BatchOp[] = []
    const now = this.clock.now()
    if (this.checkpoints) {
      // Counted once the record's batch is logged; the buckets (and pruned ones' deletion) are written behind.
      for (const d of deltas) this.prune(d.agentId, this.agents.get(d.agentId), now, ops)
      this.prune(null, this.account, now, ops)
      this.checkpoints.note(ops)
      return [this.checkpoints.op(deltas, this.count)]
    }
    for (const d of deltas) {
      this.apply(d, now, ops)
      this.prune(d.agentId, this.agents.get(d.agentId), now, ops)
    }
    this.prune(null, this.account, now, ops)
    return ops
  }

  /**
   * Add `deltas` to memory and mark the buckets they change for the next checkpoint. A delta in
   * hours or minutes not read yet (a change that skipped `prepare`; a row a crash left) is
   * counted once they are.
   */
  private readonly count = (deltas: Delta[]): void | Promise<void> => {
    const now = this.clock.now()
    const counted = (): void => {
      for (const d of deltas) this.apply(d, this.clock.now(), undefined, this.dirty)
    }
    if (!deltas.some((d) => this.unread(d, now))) return counted()
    return (async () => {
      for (const d of deltas) await this.ready(d.agentId, floorTo(d.at, MINUTE_MS))
      counted()
    })()
  }

  /** Whether `d` falls in the agent's hours, or kept minutes, not read from the store yet. */
  private unread(d: Delta, now: number): boolean {
    const a = this.agents.get(d.agentId)
    if (!a) return false
    const minuteStart = floorTo(d.at, MINUTE_MS)
    return floorTo(d.at, HOUR_MS) < a.loadedFrom || (minuteStart < a.minutesFrom && kept('minute', minuteStart, now))
  }

  /** LevelDB: write what was counted since the last checkpoint (at shutdown, after the last record is written). */
  async flush(): Promise<void> {
    await this.checkpoints?.flush()
  }

  agentIds(): string[] {
    return [...this.agents.keys()]
  }

  /** The agent's buckets in memory (its hours before `loadedFrom` are not: see `ready`). */
  agent(agentId: string): AgentBuckets | undefined {
    return this.agents.get(agentId)
  }

  /**
   * Make the agent's buckets from `from` (ms) on readable from memory: its older hours (and
   * minutes, for a minute-exact span) are read from the store once.
   */
  async ready(agentId: string, from: number, precision: Precision = 'minute'): Promise<AgentBuckets | undefined> {
    const a = this.agents.get(agentId)
    if (a && from < a.loadedFrom) await this.loadOlder(agentId, 'hour')
    if (a && precision === 'minute' && from < a.minutesFrom) await this.loadOlder(agentId, 'minute')
    return a
  }

  /**
   * For the record hook's `prepare`, before a record's change is written: the hours it will
   * touch (its creation hour, for the agent and each invoker) are brought into memory, so the
   * synchronous contributor finds them there (a payment made paid long after it was created).
   */
  readonly prepare = async (record: TxRecord): Promise<void> => {
    for (const agentId of new Set([record.agentId, ...(record.invocation?.invokers ?? [])])) await this.ready(agentId, floorTo(record.createdAt, MINUTE_MS))
  }

  private agentOf(agentId: string): AgentBuckets {
    let a = this.agents.get(agentId)
    // An agent not seen at start has nothing stored: all of it is in memory.
    if (!a) this.agents.set(agentId, (a = newBuckets(ALL)))
    return a
  }

  /** Add `d` to its hour and minute buckets (those still kept), the agent's and the account's, with their puts when `ops` is given, marked in `dirty` when it is. */
  private apply(d: Delta, now: number, ops?: BatchOp[], dirty?: DirtyBuckets): void {
    const hourStart = floorTo(d.at, HOUR_MS)
    if (!kept('hour', hourStart, now)) return
    const a = this.agentOf(d.agentId)
    const minuteStart = floorTo(d.at, MINUTE_MS)
    if (this.unread(d, now)) return this.late(d, now, ops)
    const hour = bucketOf(a, 'hour', hourStart)
    // The hour decides whether an endpoint is kept or folds into `other`, for its minutes too.
    const endpoint = d.kind === 'paid' ? endpointKey(hour, d.endpoint) : ''
    const dayStart = floorTo(d.at, DAY_MS)
    const [day, acctHour, acctDay] = [bucketOf(a, 'day', dayStart), bucketOf(this.account, 'hour', hourStart), bucketOf(this.account, 'day', dayStart)]
    applyDelta(hour, d, endpoint)
    applyDelta(day, d, endpoint)
    applyAccount(acctHour, d, endpoint)
    applyAccount(acctDay, d, endpoint)
    if (ops) ops.push(this.putOp(bucketKey(d.agentId, 'hour', hourStart), hour), ...this.accountOps('hour', hourStart, acctHour, d, endpoint))
    if (dirty) {
      dirty.agent(hour, d.agentId, 'hour', hourStart)
      dirty.accountBucket(acctHour, 'hour', hourStart, d, endpoint)
    }
    // A shared store keeps the days as rows too: a long window reads them, not every hour.
    if (ops && this.shared) ops.push(this.putOp(bucketKey(d.agentId, 'day', dayStart), day), ...this.accountOps('day', dayStart, acctDay, d, endpoint))
    if (!kept('minute', minuteStart, now)) return
    const minute = bucketOf(a, 'minute', minuteStart)
    applyDelta(minute, d, endpoint)
    const acctMinute = bucketOf(this.account, 'minute', minuteStart)
    applyAccount(acctMinute, d, endpoint)
    if (ops) ops.push(this.putOp(bucketKey(d.agentId, 'minute', minuteStart), minute), ...this.accountOps('minute', minuteStart, acctMinute, d, endpoint))
    if (dirty) {
      dirty.agent(minute, d.agentId, 'minute', minuteStart)
      dirty.accountBucket(acctMinute, 'minute', minuteStart, d, endpoint)
    }
  }

  /**
   * A shared store's live change to an hour still only in the store (`prepare` was not called
   * for it: it should not happen). Its bucket cannot be written without its stored state, so
   * the version is cleared in this write (the next start rebuilds from the records) and the
   * change is counted in memory once the agent's hours are read. (On LevelDB `count` reads the
   * hours first.)
   */
  private late(d: Delta, now: number, ops?: BatchOp[]): void {
    if (!ops) return
    if (this.meta) ops.push({ type: 'del', coll: this.meta, key: AGGREGATES_META_KEY })
    void this.loadOlder(d.agentId, 'hour')
      .then(() => this.loadOlder(d.agentId, 'minute'))
      .then(() => this.apply(d, now))
  }

  private putOp(key: string, b: Bucket): BatchOp {
    return agentBucketPut(this.rows, key, b, true)
  }

  /** The account bucket and the one endpoint and by-agent entry a change made (a payment), written as the batch is logged. */
  private accountOps(precision: Level, start: number, b: Bucket, d: Delta, endpoint: string): BatchOp[] {
    const paid = d.kind === 'paid'
    return accountBucketPuts(this.rows, precision, start, b, paid ? [endpoint] : [], paid ? [d.agentId] : [], true)
  }

  /** Drop the buckets past retention (memory and store), at most every PRUNE_EVERY_MS; `agentId` null: the account's. */
  private prune(agentId: string | null, a: AgentBuckets | undefined, now: number, ops: BatchOp[]): void {
    if (!a || now - a.prunedAt < PRUNE_EVERY_MS) return
    a.prunedAt = now
    for (const [precision, m] of [
      ['minute', a.minutes],
      ['hour', a.hours],
      ['day', a.days],
    ] as const) {
      for (const [start, b] of m) {
        if (keptLevel(precision, start, now)) continue
        m.delete(start)
        this.dirty.forget(b)
        // Days are rows only on a shared store (on LevelDB only memory, the sums of the hours).
        if (precision === 'day' && !this.shared) continue
        if (agentId === null) ops.push(...accountBucketDels(this.rows, precision, start, b))
        else ops.push({ type: 'del', coll: this.rows.agents as Collection<unknown>, key: this.rows.prefix + bucketKey(agentId, precision, start) })
      }
    }
  }

  /** Add a record as it stands (a backfill or a recount: everything in memory). */
  addRecord(r: TxRecord, now: number): void {
    for (const d of deltasOfRecord(r)) this.apply(d, now)
  }

  /**
   * Read the stored aggregates, or, when the store has none of this version, build them from
   * the records (once: the version is written last, so an interrupted build starts over).
   * Call before the contributor is registered and before anything writes records.
   */
  async start(transactions: Transactions, meta: Collection<unknown>): Promise<{ backfilled: number | null; buckets: number; replayed: number }> {
    this.meta = meta
    if (this.shared) return { ...(await this.shared.run('metrics:aggregates', () => this.startShared(transactions, meta))), replayed: 0 }
    if ((await meta.get(AGGREGATES_META_KEY)) !== AGGREGATES_VERSION) return { ...(await this.backfill(transactions, meta, [])), replayed: 0 }
    const buckets = await loadRecent(this.store, this.coll, this.accountColl, this.account, this.agents, this.clock.now())
    // The deltas a crash left uncounted in the stored buckets (each one's hours read first, as `prepare` does).
    const replayed = await this.checkpoints!.replay(this.count)
    return { backfilled: null, buckets, replayed }
  }

  /** Build the base rows from the records (the version written last, with `more`), everything counted in memory. */
  private async backfill(transactions: Transactions, meta: Collection<unknown>, more: BatchOp[]): Promise<{ backfilled: number; buckets: number }> {
    const now = this.clock.now()
    await clear(this.store, this.coll as Collection<unknown>)
    await clear(this.store, this.accountColl)
    // The records hold every change a delta row does.
    await clear(this.store, this.store.collection(DELTA_COLLECTION))
    let n = 0
    for await (const [, r] of transactions.records.entries()) {
      this.addRecord(r, now)
      n++
    }
    const buckets = (await writeValues(this.store, this.coll as Collection<unknown>, this.encoded(agentBuckets(this.agents, this.shared !== null)))) + (await this.writeAccount())
    await this.store.batch([{ type: 'put', coll: meta, key: AGGREGATES_META_KEY, value: AGGREGATES_VERSION }, ...more])
    return { backfilled: n, buckets }
  }

  /**
   * A shared store (holding the replicas' lock): nothing to load, this replica's rows start
   * empty. Without base rows counted from the records on this version, they are built once
   * and every replica's rows dropped (the records hold everything they counted).
   */
  private async startShared(transactions: Transactions, meta: Collection<unknown>): Promise<{ backfilled: number | null; buckets: number }> {
    const [version, shared] = await meta.getMany([AGGREGATES_META_KEY, SHARED_META_KEY])
    if (version === AGGREGATES_VERSION && shared === AGGREGATES_VERSION) return { backfilled: null, buckets: 0 }
    await clear(this.store, this.store.collection(REPLICA_AGENTS))
    await clear(this.store, this.store.collection(REPLICA_ACCOUNT))
    const built = await this.backfill(transactions, meta, [{ type: 'put', coll: meta, key: SHARED_META_KEY, value: AGGREGATES_VERSION }])
    // What was counted is in the base rows; this replica's own start from nothing.
    this.agents.clear()
    for (const m of [this.account.minutes, this.account.hours, this.account.days]) m.clear()
    return built
  }

  /** Read the agent's hours before `loadedFrom`, or minutes before `minutesFrom` (once, however many ask at the same time). */
  private loadOlder(agentId: string, precision: Precision): Promise<void> {
    const key = `${precision}\x00${agentId}`
    let p = this.loading.get(key)
    if (!p) {
      p = readOlder(this.store, this.coll, agentId, this.agentOf(agentId), precision, this.clock.now()).finally(() => this.loading.delete(key))
      this.loading.set(key, p)
    }
    return p
  }

  private *encoded(buckets: Iterable<[string, Bucket]>): Iterable<[string, StoredBucket]> {
    for (const [key, b] of buckets) yield [key, encodeBucket(b)]
  }

  /** The account's buckets as the contributor writes them (each map entry its own key); returns how many buckets. */
  private async writeAccount(): Promise<number> {
    await writeValues(this.store, this.accountColl, accountValues(this.account, this.shared !== null))
    return this.account.minutes.size + this.account.hours.size
  }

  /** What is in memory: agents, and buckets (minutes and hours, the account's included). */
  stats(): { agents: number; loadedAgents: number; buckets: number } {
    let buckets = this.account.minutes.size + this.account.hours.size
    let loadedAgents = 0
    for (const a of this.agents.values()) {
      buckets += a.minutes.size + a.hours.size
      if (a.loadedFrom === ALL && a.minutesFrom === ALL) loadedAgents++
    }
    return { agents: this.agents.size, loadedAgents, buckets }
  }

  /** Every bucket (the agents' and the account's) as stored JSON text, by key, every agent read in full first: what a recount is compared with. */
  async snapshot(): Promise<Map<string, string>> {
    for (const agentId of this.agents.keys()) {
      await this.loadOlder(agentId, 'hour')
      await this.loadOlder(agentId, 'minute')
    }
    return this.snapshotInMemory()
  }

  private snapshotInMemory(): Map<string, string> {
    const out = new Map<string, string>()
    for (const [key, b] of agentBuckets(this.agents, this.shared !== null)) out.set(key, canonical(b))
    for (const [key, b] of accountBuckets(this.account, ACCOUNT_SNAPSHOT)) out.set(key, canonical(b))
    return out
  }

  /** The aggregates a fresh count of every record gives (sessions are not records: not in it). */
  static async recount(store: Store, transactions: Transactions, clock: Clock): Promise<Map<string, string>> {
    const fresh = new Aggregates(store, clock)
    const now = clock.now()
    for await (const [, r] of transactions.records.entries()) fresh.addRecord(r, now)
    return fresh.snapshotInMemory()
  }
}

/** The aggregates a fresh count of every record gives (sessions are not records: not in it). */
export const recount = (store: Store, transactions: Transactions, clock: Clock): Promise<Map<string, string>> => Aggregates.recount(store, transactions, clock)
