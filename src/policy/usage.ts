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
  /** Timestamps (ms) of payments, pruned to the longest rate window (24 h). */
  payments: number[]
  /** Reservations of payments in flight. */
  holds?: Hold[]
}

export const emptyUsage = (): UsageState => ({ periodStart: null, spent: '0', payments: [] })

export const periodActive = (u: UsageState, now: number): boolean => u.periodStart !== null && now < u.periodStart + DAY_MS

/** Spend committed in the current period (0 once the period has reset). */
export const usedToday = (u: UsageState, now: number): bigint => (periodActive(u, now) ? BigInt(u.spent) : 0n)

export const heldAmount = (u: UsageState): bigint => (u.holds ?? []).reduce((s, h) => s + BigInt(h.amount), 0n)

/** Payments made in the trailing window ending at `now`. */
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
 * active, adds to spend, and is counted for the rate window.
 */
export function commit(u: UsageState, id: string, now: number): UsageState {
  const h = (u.holds ?? []).find((x) => x.id === id)
  if (!h) return u
  const active = periodActive(u, now)
  return {
    periodStart: active ? u.periodStart : now,
    spent: ((active ? BigInt(u.spent) : 0n) + BigInt(h.amount)).toString(),
    payments: [...u.payments.filter((t) => t > now - DAY_MS), now],
    holds: (u.holds ?? []).filter((x) => x.id !== id),
  }
}
