import { type Bucket, emptyBucket, mergeInto } from './buckets.js'
import { DAY_MS, floorTo, type Precision } from './windows.js'

/** One agent's (or the account's) buckets as held in memory and summed by the queries. */
export interface AgentBuckets {
  /** By bucket start (ms): the minutes from `minutesFrom` on (all of them once read). */
  minutes: Map<number, Bucket>
  /** The hours from `loadedFrom` on (all of them once the agent is loaded). */
  hours: Map<number, Bucket>
  /** The hours summed by UTC day, in memory only: long windows read days. Whole for days from `loadedFrom` on. */
  days: Map<number, Bucket>
  prunedAt: number
  /** Hours before this (a UTC day start) are still only in the store; -Infinity: every hour is in memory. */
  loadedFrom: number
  /** The same for minutes (an hour start). */
  minutesFrom: number
}

export const ALL = Number.NEGATIVE_INFINITY
export const newBuckets = (loadedFrom: number, minutesFrom = loadedFrom): AgentBuckets => ({ minutes: new Map(), hours: new Map(), days: new Map(), prunedAt: 0, loadedFrom, minutesFrom })

export function bucketOf(a: AgentBuckets, precision: Precision | 'day', start: number): Bucket {
  const m = precision === 'minute' ? a.minutes : precision === 'hour' ? a.hours : a.days
  let b = m.get(start)
  if (!b) m.set(start, (b = emptyBucket()))
  return b
}

/** Put `b` (an hour) into `a` with its day sum. */
export function addHour(a: AgentBuckets, start: number, b: Bucket): void {
  a.hours.set(start, b)
  mergeInto(bucketOf(a, 'day', floorTo(start, DAY_MS)), b, true)
}
