/**
 * An agent's stored spend usage, and pure reads and updates of it. The daily period
 * starts at the first payment and resets 24 h later; rate counts are payments in a
 * sliding window. Payments in flight hold a reservation that counts like spend until it
 * is committed (paid) or released (not paid).
 */
export const DAY_MS = 24 * 60 * 60 * 1000
export const HOUR_MS = 60 * 60 * 1000
export const MINUTE_MS = 60_000

/**
 * Payment timestamps kept whatever the rate limit (at least; `commit` keeps the limit's
 * `calls` when that is more), so a limit set or raised later is decided on exact times
 * for the payments made before it, as far as these reach.
 */
export const EXACT_PAYMENTS = 64

export interface Hold {
  id: string
  /** Base units. */
  amount: string
  at: number
  /**
   * An invocation's cap hold (`cap:<invocationId>`): counts toward the daily budget, not toward
   * the rate limit, and reserves no wallet funds (sub-agents pay from their own wallets).
   */
  cap?: true
  /** A payment made inside the agent's own invocation: `drawn` base units were taken from the cap hold `from`. */
  from?: string
  drawn?: string
}

export interface UsageState {
  /** Start of the current budget period (ms), or null before the first payment. */
  periodStart: number | null
  /** Base units committed in the current period. */
  spent: string
  /**
   * Timestamps (ms) of the most recent payments, oldest first, pruned to 24 h: at most
   * the larger of the rate limit's `calls` and `EXACT_PAYMENTS` when written (records of
   * older versions hold at most the limit of their day). Every payment is also in the buckets.
   */
  payments: number[]
  /** Payments per minute `[minuteStartMs, count]` for the trailing hour (`usedThisHour`, rate windows up to 1 h). */
  perMinute?: Buckets
  /** Payments per hour `[hourStartMs, count]` for the trailing 24 h (the 24 h rate window). */
  perHour?: Buckets
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

/** What payments in flight reserve of the wallet's funds (cap holds excluded). */
export const paymentHeldAmount = (u: UsageState): bigint => (u.holds ?? []).reduce((s, h) => (h.cap ? s : s + BigInt(h.amount)), 0n)

/** Payments in flight (cap holds are not payments: the rate limit does not count them). */
export const paymentsInFlight = (u: UsageState): number => (u.holds ?? []).reduce((n, h) => (h.cap ? n : n + 1), 0)

/** `[startMs, count]`, a start a whole number of bucket sizes since the epoch. */
export type Buckets = [number, number][]

/**
 * Count one event at `now` in `[startMs, count]` buckets of `sizeMs`, dropping buckets that
 * end before the trailing `horizonMs` (the one straddling its start stays: a window of that
 * length ending later may still reach into it).
 */
function bump(buckets: Buckets | undefined, now: number, sizeMs: number, horizonMs: number): Buckets {
  const start = now - (now % sizeMs)
  const kept = (buckets ?? []).filter(([b]) => b + sizeMs > now - horizonMs)
  const last = kept[kept.length - 1]
  if (last && last[0] === start) kept[kept.length - 1] = [start, last[1] + 1]
  else kept.push([start, 1])
  return kept
}

/** Events counted in the buckets of the trailing `horizonMs`. */
const sumWithin = (buckets: Buckets | undefined, now: number, horizonMs: number): number => (buckets ?? []).reduce((n, [b, c]) => (b > now - horizonMs && b <= now ? n + c : n), 0)

/** Payment calls in the trailing 60 minutes, to the minute. */
export const paymentsThisHour = (u: UsageState, now: number): number => sumWithin(u.perMinute, now, HOUR_MS)

/**
 * Payments made in the window `(now - windowMs, now]` (up to 24 h), for the rate decision,
 * whatever the limit was when they were made.
 *
 * Exact when the kept timestamps reach back to the window start: every payment after the
 * oldest kept one is kept. That always holds while a limit has stood: `commit` keeps at
 * least `calls` timestamps, so a window they do not reach back across already holds `calls`.
 * Payments older than the oldest kept timestamp (dropped under a lower or no limit) are
 * counted from buckets, minute buckets for windows up to 1 h and hour buckets for 24 h, a
 * bucket straddling the window start counted whole. So the count may include up to one bucket
 * (1 min, or 1 h for 24 h) of payments from just before the window, never fewer than were
 * made in it: at worst a payment is rejected early, never let over the limit.
 */
export function paymentsWithin(u: UsageState, now: number, windowMs: number): number {
  const from = now - windowMs
  const kept = u.payments
  let n = 0
  for (const t of kept) if (t > from && t <= now) n++
  const oldest = kept.length > 0 ? kept[0]! : Infinity
  if (oldest <= from) return n
  const [buckets, size] = windowMs <= HOUR_MS ? [u.perMinute, MINUTE_MS] : [u.perHour, HOUR_MS]
  for (const [b, c] of buckets ?? []) {
    if (b + size <= from || b > now || b > oldest) continue
    // Only the bucket holding the oldest kept timestamp also holds kept ones (counted above).
    let counted = 0
    while (counted < kept.length && kept[counted]! < b + size) counted++
    n += Math.max(0, c - counted)
  }
  return n
}

/** Add a reservation. */
export const hold = (u: UsageState, h: Hold): UsageState => ({ ...u, holds: [...(u.holds ?? []), h] })

/**
 * Drop a reservation without spending it. A payment that drew on a cap hold gives what it drew
 * back to it, if the cap hold is still there (its invocation still open).
 */
export function release(u: UsageState, id: string): UsageState {
  const holds = u.holds ?? []
  const h = holds.find((x) => x.id === id)
  if (!h) return u
  const rest = holds.filter((x) => x.id !== id)
  if (h.from && h.drawn) {
    const i = rest.findIndex((x) => x.id === h.from)
    if (i >= 0) rest[i] = { ...rest[i]!, amount: (BigInt(rest[i]!.amount) + BigInt(h.drawn)).toString() }
  }
  return { ...u, holds: rest }
}

/** The hold id of an invocation's cap hold in its orchestrator's usage. */
export const capHoldId = (invocationId: string): string => `cap:${invocationId}`

/**
 * A payment's hold, drawn from the cap hold `capId` as far as it reaches: the amount moves from
 * the cap hold to the payment's hold, so the daily budget sees it once.
 */
export function holdDrawn(u: UsageState, h: Hold, capId: string): UsageState {
  const holds = [...(u.holds ?? [])]
  const i = holds.findIndex((x) => x.id === capId)
  if (i < 0) return hold(u, h)
  const cap = BigInt(holds[i]!.amount)
  const want = BigInt(h.amount)
  const drawn = want < cap ? want : cap
  holds[i] = { ...holds[i]!, amount: (cap - drawn).toString() }
  holds.push({ ...h, from: capId, drawn: drawn.toString() })
  return { ...u, holds }
}

/** How much of a payment of `amount` the cap hold `capId` covers (what the daily budget already counts). */
export function coveredByCap(u: UsageState, capId: string, amount: bigint): bigint {
  const cap = (u.holds ?? []).find((x) => x.id === capId)
  if (!cap) return 0n
  const left = BigInt(cap.amount)
  return amount < left ? amount : left
}

/**
 * Turn a reservation into spend at `now`: a payment opens a new period when none is
 * active, adds to spend, and is counted for the rate window. `calls` is the rate limit's
 * (0 with none): that many recent timestamps, at least `EXACT_PAYMENTS`, are kept, and
 * 61 minute and 25 hour buckets, so usage stays small at any payment rate.
 */
export function commit(u: UsageState, id: string, now: number, calls: number): UsageState {
  const h = (u.holds ?? []).find((x) => x.id === id)
  if (!h) return u
  const active = periodActive(u, now)
  const keep = Math.max(calls, EXACT_PAYMENTS)
  const recent = u.payments.filter((t) => t > now - DAY_MS)
  recent.push(now)
  return {
    periodStart: active ? u.periodStart : now,
    spent: ((active ? BigInt(u.spent) : 0n) + BigInt(h.amount)).toString(),
    payments: recent.length > keep ? recent.slice(-keep) : recent,
    perMinute: bump(u.perMinute, now, MINUTE_MS, HOUR_MS),
    perHour: bump(u.perHour, now, HOUR_MS, DAY_MS),
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
