import type { BatchOp, Collection, RangeOptions, Store } from '../store/index.js'
import { type Bucket, decodeBucket, emptyBucket, encodeBucket, type StoredBucket, totalsEntry } from './buckets.js'
import { DAY_MS, HOUR_RETENTION_MS, kept, MINUTE_RETENTION_MS, type Precision, sizeOf } from './windows.js'

/**
 * Where the aggregates' buckets live in the store and how they are read back in ranges: per
 * agent in `metricsAgg` (`<agentId>\0m|h\0<start>`, sorted per agent, precision and time), the
 * account's in `metricsAccount` (`m|h\0<start>`). Only ordered key ranges are used, which any
 * backend behind `src/store/` offers.
 */
const CHUNK = 1000

/** A bucket's size: minutes and hours everywhere; UTC days are rows only on a store shared by replicas (in memory on LevelDB). */
export type Level = Precision | 'day'
const code = (p: Level): string => (p === 'minute' ? 'm' : p === 'hour' ? 'h' : 'd')
const levelOf = (c: string | undefined): Level | null => (c === 'm' ? 'minute' : c === 'h' ? 'hour' : c === 'd' ? 'day' : null)
export const sizeOfLevel = (p: Level): number => (p === 'day' ? DAY_MS : sizeOf(p))
/** Whether a bucket is still kept at `now` (a day while any of its hours is). */
export const keptLevel = (p: Level, start: number, now: number): boolean => (p === 'day' ? start + DAY_MS > now - HOUR_RETENTION_MS : kept(p, start, now))
// Rounded up: a range bound between bucket starts includes the next start, not the one before.
const startText = (p: Level, start: number): string =>
  Math.ceil(start / sizeOfLevel(p))
    .toString(36)
    .padStart(8, '0')

/** `<agentId>\0m|h\0<start in buckets, base 36>`: sorted per agent and precision. */
export function bucketKey(agentId: string, precision: Level, start: number): string {
  return `${agentId}\x00${code(precision)}\x00${startText(precision, start)}`
}

/** An account bucket's key: `m|h\0<start in buckets, base 36>`. */
export function accountKey(precision: Level, start: number): string {
  return `${code(precision)}\x00${startText(precision, start)}`
}

export function parseBucketKey(key: string): { agentId: string; precision: Level; start: number } | null {
  const j = key.lastIndexOf('\x00')
  const i = key.lastIndexOf('\x00', j - 1)
  if (i <= 0) return null
  const precision = levelOf(key.slice(i + 1, j))
  if (!precision) return null
  return { agentId: key.slice(0, i), precision, start: Number.parseInt(key.slice(j + 1), 36) * sizeOfLevel(precision) }
}

/** An entry of an account bucket's endpoint (`e`) or by-agent (`a`) map, under its own key (a change rewrites one entry, not the map). */
export function accountPartKey(precision: Level, start: number, kind: 'e' | 'a', name: string): string {
  return `${accountKey(precision, start)}\x00${kind}${name}`
}

export function parseAccountKey(key: string): { precision: Level; start: number; part?: ['e' | 'a', string] } | null {
  const precision = key[1] === '\x00' ? levelOf(key[0]) : null
  if (!precision) return null
  const j = key.indexOf('\x00', 2)
  const start = Number.parseInt(key.slice(2, j < 0 ? undefined : j), 36) * sizeOfLevel(precision)
  if (j < 0) return { precision, start }
  const kind = key[j + 1]
  return kind === 'e' || kind === 'a' ? { precision, start, part: [kind, key.slice(j + 2)] } : null
}

/** The key range of one agent's buckets of one precision, from `from` (ms, inclusive) to `to` (exclusive). */
export function agentRange(agentId: string, precision: Level, from?: number, to?: number): { gte: string; lt: string } {
  const prefix = `${agentId}\x00${code(precision)}\x00`
  return {
    gte: from === undefined ? prefix : prefix + startText(precision, Math.max(0, from)),
    lt: to === undefined ? `${agentId}\x00${code(precision)}\x01` : prefix + startText(precision, Math.max(0, to)),
  }
}

/** Deletes written in slices of CHUNK. */
export class Deleter {
  private ops: BatchOp[] = []
  constructor(
    private readonly store: Store,
    private readonly coll: Collection<unknown>,
  ) {}
  async del(key: string): Promise<void> {
    this.ops.push({ type: 'del', coll: this.coll, key })
    if (this.ops.length >= CHUNK) await this.store.batch(this.ops.splice(0))
  }
  async done(): Promise<void> {
    if (this.ops.length) await this.store.batch(this.ops.splice(0))
  }
}

/**
 * Read the buckets of `coll` in `range`, handing each still kept at `now` to `onBucket` and
 * deleting those past retention (`store` null: only skipping them). Returns how many were read.
 */
export async function readBuckets(
  store: Store | null,
  coll: Collection<StoredBucket>,
  range: { gte?: string; lt?: string },
  parse: (key: string) => { precision: Level; start: number } | null,
  now: number,
  onBucket: (precision: Level, start: number, b: Bucket) => void,
): Promise<number> {
  let n = 0
  const stale = store && new Deleter(store, coll as Collection<unknown>)
  for await (const [key, value] of coll.entries(range)) {
    const k = parse(key)
    if (!k) continue
    if (!keptLevel(k.precision, k.start, now)) await stale?.del(key)
    else {
      onBucket(k.precision, k.start, decodeBucket(value))
      n++
    }
  }
  await stale?.done()
  return n
}

/** The agents with buckets in `coll`, in key order, found by skipping from one agent's keys to the next. */
export async function* agentsIn(coll: Collection<StoredBucket>): AsyncIterable<string> {
  let gte = ''
  for (;;) {
    let next: string | undefined
    for await (const key of coll.keys({ gte, limit: 1 })) next = key
    if (next === undefined) return
    const k = parseBucketKey(next)
    if (!k) return
    yield k.agentId
    // '\x01' sorts after the '\x00' that ends every key of this agent.
    gte = `${k.agentId}\x01`
  }
}

/** Delete an agent's buckets of `precision` past retention without reading them (keys only). */
export async function dropOld(store: Store, coll: Collection<StoredBucket>, agentId: string, precision: Level, now: number): Promise<void> {
  const stale = new Deleter(store, coll as Collection<unknown>)
  const retention = precision === 'minute' ? MINUTE_RETENTION_MS : precision === 'hour' ? HOUR_RETENTION_MS : HOUR_RETENTION_MS + DAY_MS
  for await (const key of coll.keys(agentRange(agentId, precision, 0, now - retention))) await stale.del(key)
  await stale.done()
}

/** Every key of `coll` deleted. */
export async function clear(store: Store, coll: Collection<unknown>): Promise<void> {
  const d = new Deleter(store, coll)
  for await (const key of coll.keys()) await d.del(key)
  await d.done()
}

/** Write `[key, value]` pairs in slices of CHUNK; returns how many. */
export async function writeValues(store: Store, coll: Collection<unknown>, values: Iterable<[string, unknown]>): Promise<number> {
  let n = 0
  let ops: BatchOp[] = []
  for (const [key, value] of values) {
    ops.push({ type: 'put', coll, key, value })
    n++
    if (ops.length >= CHUNK) {
      await store.batch(ops)
      ops = []
    }
  }
  if (ops.length) await store.batch(ops)
  return n
}

/**
 * Read the account's buckets (each a key of its own and one key per endpoint and by-agent
 * entry), handing each still kept at `now` to `onBucket` whole; those past retention are deleted
 * (`store` null: skipped). `range` and `prefix` (which every key then starts with): a part of them.
 */
export async function readAccount(
  store: Store | null,
  coll: Collection<unknown>,
  now: number,
  onBucket: (precision: Level, start: number, b: Bucket) => void,
  { range, prefix = '' }: { range?: RangeOptions; prefix?: string } = {},
): Promise<number> {
  const stale = store && new Deleter(store, coll)
  let current: { precision: Level; start: number; b: Bucket } | null = null
  let n = 0
  const done = (): void => {
    if (current) onBucket(current.precision, current.start, current.b)
    current = null
  }
  // A bucket's key sorts just before its entries' keys.
  for await (const [key, value] of coll.entries(range)) {
    const k = parseAccountKey(prefix ? key.slice(prefix.length) : key)
    if (!k) continue
    if (!keptLevel(k.precision, k.start, now)) {
      await stale?.del(key)
      continue
    }
    if (!current || current.precision !== k.precision || current.start !== k.start) {
      done()
      current = { precision: k.precision, start: k.start, b: k.part ? emptyBucket() : decodeBucket(value as StoredBucket) }
      n++
    }
    if (k.part) {
      const [spend, count] = value as [string, number]
      const m = k.part[0] === 'e' ? current.b.endpoints : (current.b.byAgent ??= new Map())
      m.set(k.part[1], { spend: BigInt(spend), n: count })
    }
  }
  done()
  await stale?.done()
  return n
}

/** The account's buckets as stored: each bucket without its maps, and each endpoint and by-agent entry under a key of its own. */
export function* accountValues(account: { minutes: Map<number, Bucket>; hours: Map<number, Bucket>; days: Map<number, Bucket> }, days = false): Iterable<[string, unknown]> {
  for (const [precision, m] of [
    ['minute', account.minutes],
    ['hour', account.hours],
    ['day', days ? account.days : new Map<number, Bucket>()],
  ] as const) {
    for (const [start, b] of m) {
      yield [accountKey(precision, start), encodeBucket(b, false)]
      for (const [name, e] of b.endpoints) yield [accountPartKey(precision, start, 'e', name), totalsEntry(e)]
      for (const [name, e] of b.byAgent ?? []) yield [accountPartKey(precision, start, 'a', name), totalsEntry(e)]
    }
  }
}
