import { type Buckets, HOUR_MS, MINUTE_MS, type UsageState } from './usage.js'

/**
 * Usage as stored: the payment times are one string, the first time then the gaps between
 * times (`"1795816066731,1,2,1"`), where a JSON array of times took 14 characters a payment.
 * The minute and hour counts are one string each too, the first bucket's start in buckets
 * since the epoch then the gap to each next one, with its count (`"29930267:3,1:60,2:7"`),
 * where a JSON array took about 20 characters a bucket: an agent paying every minute keeps 61
 * minute and 25 hour buckets. Usage is written twice a payment (its hold, its commit); as
 * arrays that was 2 KB of JSON to make and log each time, and number formatting at that.
 * Records of earlier versions, with arrays, are read as they are.
 */
export type StoredUsage = Omit<UsageState, 'payments' | 'perMinute' | 'perHour' | 'sessionCalls'> & {
  payments: number[] | string
  perMinute?: Buckets | string
  perHour?: Buckets | string
  sessionCalls?: { total: number; hours: Buckets | string }
}

/** How a list is written as gaps: its first entry whole, each next one against the one before. */
interface Gaps<E> {
  valid(e: E): boolean
  first(e: E): string
  next(e: E, before: E): string
  same(a: E, b: E): boolean
}

/** Times in whole milliseconds (fractions would add up rounding errors: such a list stays an array). */
const TIMES: Gaps<number> = {
  valid: Number.isSafeInteger,
  first: (t) => `${t}`,
  next: (t, before) => `${t - before}`,
  same: (a, b) => a === b,
}

/** `[start, count]` buckets, starts in bucket sizes; buckets not on whole sizes stay an array. */
function bucketGaps(size: number): Gaps<[number, number]> {
  return {
    valid: (b) => Number.isSafeInteger(b[0]) && b[0] % size === 0 && Number.isSafeInteger(b[1]),
    first: (b) => `${b[0] / size}:${b[1]}`,
    next: (b, before) => `${(b[0] - before[0]) / size}:${b[1]}`,
    same: (a, b) => a[0] === b[0] && a[1] === b[1],
  }
}
const MINUTES = bucketGaps(MINUTE_MS)
const HOURS = bucketGaps(HOUR_MS)

/**
 * The encoding of each list, kept while the list lives: a hold shares its usage's lists, so its
 * write reuses the commit's. (Usage is replaced, never changed in place.)
 */
const encoded = new WeakMap<readonly unknown[], string>()

/** `list` as gaps (cached), from the encoding of the list it was made from when that is known; the list itself if an entry is not valid. */
function encodeList<E>(list: E[], g: Gaps<E>, before?: E[]): string | E[] {
  let s: string | null | undefined = encoded.get(list)
  if (s !== undefined) return s
  // (derived's null, a new entry not valid, is final: `??` would encode the whole list again to find it)
  const cut = before ? derived(list, g, before) : undefined
  s = cut === undefined ? whole(list, g, 0, '') : cut
  if (s === null) return list
  encoded.set(list, s)
  return s
}

/**
 * Entries `from` on appended to `s` (which ends with entry `from - 1`, or is empty when `from`
 * is 0); null if one of them is not valid. Entries before `from` were checked when `s` was made.
 */
function whole<E>(list: readonly E[], g: Gaps<E>, from: number, s: string): string | null {
  for (let i = from; i < list.length; i++) {
    if (!g.valid(list[i]!)) return null
    s += i ? `,${g.next(list[i]!, list[i - 1]!)}` : g.first(list[i]!)
  }
  return s
}

/**
 * The encoding of `list` cut from that of `before` where they share a run of entries, and the
 * rest appended: a commit drops the oldest entries and adds or updates the newest, so writing
 * a commit's usage formats a number or two, not every one. Undefined when they share none;
 * null when a new entry is not valid (the shared ones are: `before` has an encoding).
 */
function derived<E>(list: readonly E[], g: Gaps<E>, before: readonly E[]): string | null | undefined {
  const prev = encoded.get(before)
  if (prev === undefined || !list.length) return undefined
  let d = 0
  while (d < before.length && !g.same(before[d]!, list[0]!)) d++
  let k = 0
  while (d + k < before.length && k < list.length && g.same(before[d + k]!, list[k]!)) k++
  if (!k) return undefined
  // Entries d .. d + k - 1 of `prev`: skip d entries, cut what follows the kept ones.
  let start = 0
  for (let i = 0; i < d; i++) start = prev.indexOf(',', start) + 1
  let end = prev.length
  for (let i = before.length - d - k; i > 0; i--) end = prev.lastIndexOf(',', end - 1)
  // The first kept entry becomes whole; the kept gaps after it stay as they are.
  const comma = prev.indexOf(',', start)
  const rest = comma < 0 || comma >= end ? '' : prev.slice(comma, end)
  return whole(list, g, k, g.first(list[0]!) + rest)
}

function decodeList<E>(s: string, decode: (part: string, before: E | undefined) => E): E[] {
  const out: E[] = []
  if (!s) return out
  for (const part of s.split(',')) out.push(decode(part, out[out.length - 1]))
  return out
}

const decodeTimes = (s: string): number[] => decodeList<number>(s, (part, before) => (before ?? 0) + Number(part))

function decodeBuckets(s: Buckets | string, size: number): Buckets {
  if (typeof s !== 'string') return s
  return decodeList<[number, number]>(s, (part, before) => {
    const colon = part.indexOf(':')
    return [(before?.[0] ?? 0) + Number(part.slice(0, colon)) * size, Number(part.slice(colon + 1))]
  })
}

/** `u` as stored; `before`, the usage it was made from (its lists' encodings are reused where they overlap). */
export function storedUsage(u: UsageState, before?: UsageState): StoredUsage {
  const s: StoredUsage = { ...u, payments: encodeList(u.payments, TIMES, before?.payments) }
  if (u.perMinute) s.perMinute = encodeList(u.perMinute, MINUTES, before?.perMinute)
  if (u.perHour) s.perHour = encodeList(u.perHour, HOURS, before?.perHour)
  if (u.sessionCalls) s.sessionCalls = { total: u.sessionCalls.total, hours: encodeList(u.sessionCalls.hours, HOURS, before?.sessionCalls?.hours) }
  return s
}

export function usageFromStore(s: StoredUsage): UsageState {
  const u = { ...s, payments: typeof s.payments === 'string' ? decodeTimes(s.payments) : s.payments } as UsageState
  if (s.perMinute !== undefined) u.perMinute = decodeBuckets(s.perMinute, MINUTE_MS)
  if (s.perHour !== undefined) u.perHour = decodeBuckets(s.perHour, HOUR_MS)
  if (s.sessionCalls) u.sessionCalls = { total: s.sessionCalls.total, hours: decodeBuckets(s.sessionCalls.hours, HOUR_MS) }
  return u
}
