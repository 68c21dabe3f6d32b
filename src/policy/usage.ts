/**
 * An agent's stored spend usage, and pure reads of it. The daily period starts at the
 * first payment and resets 24 h later; rate counts are payments in a sliding window.
 */
export const DAY_MS = 24 * 60 * 60 * 1000
export const HOUR_MS = 60 * 60 * 1000

export interface UsageState {
  /** Start of the current budget period (ms), or null before the first payment. */
  periodStart: number | null
  /** Base units committed in the current period. */
  spent: string
  /** Timestamps (ms) of payments, pruned to the longest rate window (24 h). */
  payments: number[]
}

export const emptyUsage = (): UsageState => ({ periodStart: null, spent: '0', payments: [] })

export const periodActive = (u: UsageState, now: number): boolean => u.periodStart !== null && now < u.periodStart + DAY_MS

/** Spend committed in the current period (0 once the period has reset). */
export const usedToday = (u: UsageState, now: number): bigint => (periodActive(u, now) ? BigInt(u.spent) : 0n)

/** Payments made in the trailing window ending at `now`. */
export const paymentsWithin = (u: UsageState, now: number, windowMs: number): number => {
  let n = 0
  for (const t of u.payments) if (t > now - windowMs && t <= now) n++
  return n
}
