import type { Collection, Store } from '../store/index.js'
import { accountKey, agentRange, agentsIn, bucketKey, dropOld, parseBucketKey, readAccount, readBuckets } from './bucket-store.js'
import type { Bucket, StoredBucket } from './buckets.js'
import { type AgentBuckets, addHour, ALL, newBuckets } from './agent-buckets.js'
import { DAY_MS, floorTo, HOUR_MS, MINUTE_RETENTION_MS, type Precision } from './windows.js'

/**
 * The stored buckets read into memory (`aggregates.ts` holds them): at start what live writes
 * touch, an agent's older hours and minutes when a query or a late change first needs them.
 */

/** Read at start: minutes from the hour before the current one, hours from the UTC day two days back (what live writes touch). */
const EAGER_MINUTES_MS = HOUR_MS

/** The account's buckets, and every agent's minutes and hours from the UTC day two days back, into `account` and `agents`; how many buckets were read. */
export async function loadRecent(
  store: Store,
  coll: Collection<StoredBucket>,
  accountColl: Collection<unknown>,
  account: AgentBuckets,
  agents: Map<string, AgentBuckets>,
  now: number,
): Promise<number> {
  let n = await readAccount(store, accountColl, now, (precision, start, b) => {
    if (precision === 'minute') account.minutes.set(start, b)
    else if (precision === 'hour') addHour(account, start, b)
  })
  const from = floorTo(now - MINUTE_RETENTION_MS, DAY_MS)
  const minutesFrom = floorTo(now - EAGER_MINUTES_MS, HOUR_MS)
  for await (const agentId of agentsIn(coll)) {
    const a = newBuckets(from, minutesFrom)
    agents.set(agentId, a)
    n += await readBuckets(store, coll, agentRange(agentId, 'minute', minutesFrom), parseBucketKey, now, (_, start, b) => a.minutes.set(start, b))
    n += await readBuckets(store, coll, agentRange(agentId, 'hour', from), parseBucketKey, now, (_, start, b) => addHour(a, start, b))
    await dropOld(store, coll, agentId, 'minute', now)
    await dropOld(store, coll, agentId, 'hour', now)
  }
  return n
}

/** Read the agent's hours before `loadedFrom`, or its minutes before `minutesFrom`, into `a`. */
export async function readOlder(store: Store, coll: Collection<StoredBucket>, agentId: string, a: AgentBuckets, precision: Precision, now: number): Promise<void> {
  const hours = precision === 'hour'
  const to = hours ? a.loadedFrom : a.minutesFrom
  if (to === ALL) return
  await readBuckets(store, coll, agentRange(agentId, precision, undefined, to), parseBucketKey, now, (_, start, b) => {
    if (hours) addHour(a, start, b)
    else a.minutes.set(start, b)
  })
  if (hours) a.loadedFrom = ALL
  else a.minutesFrom = ALL
}

/** Every agent's buckets by stored key (days too with `days`: a shared store keeps them as rows). */
export function* agentBuckets(agents: Map<string, AgentBuckets>, days: boolean): Iterable<[string, Bucket]> {
  for (const [agentId, a] of agents) {
    for (const [start, b] of a.minutes) yield [bucketKey(agentId, 'minute', start), b]
    for (const [start, b] of a.hours) yield [bucketKey(agentId, 'hour', start), b]
    if (days) for (const [start, b] of a.days) yield [bucketKey(agentId, 'day', start), b]
  }
}

/** The account's minutes and hours, by `prefix` and their key. */
export function* accountBuckets(account: AgentBuckets, prefix: string): Iterable<[string, Bucket]> {
  for (const [start, b] of account.minutes) yield [prefix + accountKey('minute', start), b]
  for (const [start, b] of account.hours) yield [prefix + accountKey('hour', start), b]
}
