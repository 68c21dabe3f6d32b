import type { BatchOp, Collection, Store } from '../store/index.js'
import { accountKey, agentsIn, Deleter, dropOld, keptLevel, type Level, parseAccountKey, parseBucketKey } from './bucket-store.js'
import { decodeBucket, encodeBucket, mergeInto, type StoredBucket } from './buckets.js'
import { baseRows, FOLD_COLL, FOLD_GEN_KEY, REPLICA_ACCOUNT, REPLICA_AGENTS, replicaIdsIn, replicaRows } from './replica-rows.js'
import { DAY_MS, HOUR_RETENTION_MS, MINUTE_RETENTION_MS } from './windows.js'

/**
 * Folding a stopped replica's metrics rows into the base rows (replica ids are new at every
 * start, so without it the rows of past starts would pile up and every query would read
 * them). Each chunk of rows is added to the base rows and deleted in one transaction under
 * the fold lock, which also bumps the fold generation (queries crossing it read again): the
 * sums never change, and two replicas folding the same one fold each row once.
 */
const CHUNK = 500
const FOLD_LOCK = 'metrics:fold'
/** The base rows past retention are deleted at most this often (the owners prune their own rows). */
const PRUNE_BASE_EVERY_MS = 10 * 60_000

export type RowKind = 'agents' | 'account'

/**
 * A replica's stored value of `key` added to the base's (`base` undefined: none yet), as stored;
 * undefined when the row is past retention at `now` (dropped) or not a bucket key. Pure.
 */
export function mergeStored(kind: RowKind, key: string, base: unknown, add: unknown, now: number): unknown {
  if (kind === 'agents') {
    const k = parseBucketKey(key)
    if (!k || !keptLevel(k.precision, k.start, now)) return undefined
    if (base === undefined) return add
    const b = decodeBucket(base as StoredBucket)
    mergeInto(b, decodeBucket(add as StoredBucket), true)
    return encodeBucket(b)
  }
  const k = parseAccountKey(key)
  if (!k || !keptLevel(k.precision, k.start, now)) return undefined
  if (base === undefined) return add
  if (k.part) {
    const [s1, n1] = base as [string, number]
    const [s2, n2] = add as [string, number]
    return [(BigInt(s1) + BigInt(s2)).toString(), n1 + n2]
  }
  const b = decodeBucket(base as StoredBucket)
  mergeInto(b, decodeBucket(add as StoredBucket), false)
  return encodeBucket(b, false)
}

/** Fold up to CHUNK rows of `replicaId` of one kind; how many were folded (fewer than CHUNK: none left). */
async function foldChunk(store: Store, kind: RowKind, replicaId: string, now: number): Promise<number> {
  const from = replicaRows(store, replicaId)
  const to = baseRows(store)
  const src = (kind === 'agents' ? from.agents : from.account) as Collection<unknown>
  const dst = (kind === 'agents' ? to.agents : to.account) as Collection<unknown>
  const gen = store.collection<number>(FOLD_COLL)
  const { result, written } = await store.transact(FOLD_LOCK, async () => {
    // Read under the lock: a row another replica folded first is gone.
    const rows: [string, unknown][] = []
    for await (const e of src.entries({ gte: from.prefix, lt: `${replicaId}\x01`, limit: CHUNK })) rows.push(e)
    if (!rows.length) return { ops: [], result: 0 }
    const keys = rows.map(([key]) => key.slice(from.prefix.length))
    const have = await dst.getMany(keys)
    const ops: BatchOp[] = []
    rows.forEach(([key, value], i) => {
      ops.push({ type: 'del', coll: src, key })
      const merged = mergeStored(kind, keys[i]!, have[i], value, now)
      if (merged !== undefined) ops.push({ type: 'put', coll: dst, key: keys[i]!, value: merged })
    })
    ops.push({ type: 'put', coll: gen as Collection<unknown>, key: FOLD_GEN_KEY, value: ((await gen.get(FOLD_GEN_KEY)) ?? 0) + 1 })
    return { ops, result: rows.length }
  })
  const w = await written
  if (!w.ok) throw w.error
  return result
}

/** Every metrics row of `replicaId` added into the base rows and deleted; how many rows. */
export async function foldReplica(store: Store, replicaId: string, now: number): Promise<number> {
  let n = 0
  for (const kind of ['agents', 'account'] as const) {
    for (;;) {
      const moved = await foldChunk(store, kind, replicaId, now)
      n += moved
      if (moved < CHUNK) break
    }
  }
  return n
}

/** Delete the base rows past retention at `now` (keys only). */
async function pruneBase(store: Store, now: number): Promise<void> {
  const base = baseRows(store)
  for await (const agentId of agentsIn(base.agents)) {
    for (const p of ['minute', 'hour', 'day'] as const) await dropOld(store, base.agents, agentId, p, now)
  }
  const stale = new Deleter(store, base.account)
  for (const [p, retention] of [
    ['minute', MINUTE_RETENTION_MS],
    ['hour', HOUR_RETENTION_MS],
    ['day', HOUR_RETENTION_MS + DAY_MS],
  ] as [Level, number][]) {
    // A key range ends before the first bucket still kept (its entries' keys sort right after it).
    for await (const key of base.account.keys({ gte: accountKey(p, 0), lt: accountKey(p, Math.max(0, now - retention)) })) await stale.del(key)
  }
  await stale.done()
}

export interface FoldOptions {
  /** How often a pass runs. Default 60 s. */
  everyMs?: number
  /** A replica is folded once seen not alive for this long (two passes apart at least). Default 60 s. */
  graceMs?: number
}

/** Who this replica is, and whether another replica still runs (its replica lease, `CrossLocks`). */
export interface Liveness {
  readonly replicaId: string
  alive(replicaId: string): Promise<boolean>
}

/**
 * Folds the rows of replicas that are no longer alive, in passes: a replica is folded once seen
 * not alive for `graceMs` (a replica whose lease lapsed while it stalled, and that writes again,
 * would otherwise rewrite rows already folded), and the base rows are pruned now and then.
 */
export class Folder {
  private readonly deadSince = new Map<string, number>()
  private prunedAt = Number.NEGATIVE_INFINITY
  private running: Promise<unknown> | null = null

  constructor(
    private readonly store: Store,
    private readonly now: () => number,
    private readonly self: Liveness,
    private readonly opts: FoldOptions = {},
  ) {}

  /** One pass; the replicas folded in it. */
  async pass(): Promise<string[]> {
    const now = this.now()
    const ids = new Set<string>()
    for (const name of [REPLICA_AGENTS, REPLICA_ACCOUNT]) for await (const id of replicaIdsIn(this.store.collection(name))) ids.add(id)
    const folded: string[] = []
    for (const id of ids) {
      if (id === this.self.replicaId) continue
      if (await this.self.alive(id)) {
        this.deadSince.delete(id)
        continue
      }
      const since = this.deadSince.get(id) ?? now
      this.deadSince.set(id, since)
      if (now - since < (this.opts.graceMs ?? 60_000)) continue
      await foldReplica(this.store, id, now)
      this.deadSince.delete(id)
      folded.push(id)
    }
    for (const id of this.deadSince.keys()) if (!ids.has(id)) this.deadSince.delete(id)
    if (now - this.prunedAt >= PRUNE_BASE_EVERY_MS) {
      this.prunedAt = now
      await pruneBase(this.store, now)
    }
    return folded
  }

  /** Run a pass now and every `everyMs`; the returned stop waits for a running pass. */
  start(onError: (e: unknown) => void): () => Promise<void> {
    const run = (): void => {
      if (this.running) return
      this.running = this.pass()
        .catch(onError)
        .finally(() => (this.running = null))
    }
    run()
    const timer = setInterval(run, this.opts.everyMs ?? 60_000)
    timer.unref()
    return async () => {
      clearInterval(timer)
      await this.running
    }
  }
}
