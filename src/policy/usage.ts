/**
 * An agent's stored spend usage, and pure reads and updates of it. The daily period
 * starts at the first payment and resets 24 h later; rate counts are payments in a
 * sliding window. Payments in flight hold a reservation that counts like spend until it
 * is committed (paid) or released (not paid).
 */
export const DAY_MS = 24 * 60 * 60 * 1000
export const HOUR_MS = 60 * 60 * 1000

export interface Hold {
  id: string
  /** Base units. */
  amount: string
  at: number
}

export interface UsageState {
  /** Start of the current budget period (ms), or null before the first payment. */
  periodStart: number | null
  /** Base units committed in the current period. */
  spent: string
  /**
   * Timestamps (ms) of the most recent payments: at most as many as the rate limit allows
   * (that is all a sliding-window decision needs), pruned to 24 h.
   */
  payments: number[]
  /** Payments per minute `[minuteStartMs, count]` for the trailing hour (`usedThisHour`). */
  perMinute?: Buckets
  /** Reservations of payments in flight. */
  holds?: Hold[]
  /** Calls served under an MPP session (no payment): a running total and `[hourStartMs, count]` for the trailing 24 h. */
  sessionCalls?: { total: number; hours: Buckets }
}

export const emptyUsage = (): UsageState => ({ periodStart: null, spent: '0', payments: [] })

export const periodActive = (u: UsageState, now: number): boolean => u.periodStart !== null && now < u.periodStart + DAY_MS

/** Spend committed in the current period (0 once the period has reset). */
export const usedToday = (u: UsageState, now: number): bigint => (periodActive(u, now) ? BigInt(u.spent) : 0n)

export const heldAmount = (u: UsageState): bigint => (u.holds ?? []).reduce((s, h) => s + BigInt(h.amount), 0n)

type Buckets = [number, number][]

/** Count one event at `now` in `[startMs, count]` buckets of `sizeMs`, dropping buckets older than `horizonMs`. */
function bump(buckets: Buckets | undefined, now: number, sizeMs: number, horizonMs: number): Buckets {
  const start = now - (now % sizeMs)
  const kept = (buckets ?? []).filter(([b]) => b > now - horizonMs)
  const last = kept[kept.length - 1]
  if (last && last[0] === start) kept[kept.length - 1] = [start, last[1] + 1]
  else kept.push([start, 1])
  return kept
}

/** Events counted in the buckets of the trailing `horizonMs`. */
const sumWithin = (buckets: Buckets | undefined, now: number, horizonMs: number): number =>
  (buckets ?? []).reduce((n, [b, c]) => (b > now - horizonMs && b <= now ? n + c : n), 0)

/** Payment calls in the trailing 60 minutes, to the minute. */
export const paymentsThisHour = (u: UsageState, now: number): number => sumWithin(u.perMinute, now, HOUR_MS)

/** Payments made in the trailing window ending at `now` (exact, from the kept timestamps). */
export const paymentsWithin = (u: UsageState, now: number, windowMs: number): number => {
  let n = 0
  for (const t of u.payments) if (t > now - windowMs && t <= now) n++
  return n
}

/** Add a reservation. */
export const hold = (u: UsageState, h: Hold): UsageState => ({ ...u, holds: [...(u.holds ?? []), h] })

/** Drop a reservation without spending it. */
export const release = (u: UsageState, id: string): UsageState => ({ ...u, holds: (u.holds ?? []).filter((h) => h.id !== id) })

/**
 * Turn a reservation into spend at `now`: a payment opens a new period when none is
 * active, adds to spend, and is counted for the rate window. `keep` is how many recent
 * timestamps to keep (the rate limit's `calls`; usage stays small at any payment rate).
 */
export function commit(u: UsageState, id: string, now: number, keep: number): UsageState {
  const h = (u.holds ?? []).find((x) => x.id === id)
  if (!h) return u
  const active = periodActive(u, now)
  const perMinute = bump(u.perMinute, now, 60_000, HOUR_MS)
  const recent = [...u.payments.filter((t) => t > now - DAY_MS), now]
  return {
    periodStart: active ? u.periodStart : now,
    spent: ((active ? BigInt(u.spent) : 0n) + BigInt(h.amount)).toString(),
    payments: keep > 0 ? recent.slice(-keep) : [],
    perMinute,
    holds: (u.holds ?? []).filter((x) => x.id !== id),
    ...(u.sessionCalls ? { sessionCalls: u.sessionCalls } : {}),
  }
}

/** Count one call served under an MPP session (no budget, no payment). */
export function countSessionCall(u: UsageState, now: number): UsageState {
  return { ...u, sessionCalls: { total: (u.sessionCalls?.total ?? 0) + 1, hours: bump(u.sessionCalls?.hours, now, HOUR_MS, DAY_MS) } }
}

/** Session calls in the trailing 24 h (to the hour) and in total. */
export const sessionCallsOf = (u: UsageState, now: number): { total: number; last24h: number } => ({
  total: u.sessionCalls?.total ?? 0,
  last24h: sumWithin(u.sessionCalls?.hours, now, DAY_MS),
})
