/**
 * The retry schedule (spec: States): a failed attempt is retried 1 min, 5 min, 30 min and
 * 2 h after each failure; when the fourth retry fails the delivery is dropped.
 */
export const RETRY_DELAYS_MS: readonly number[] = [60_000, 300_000, 1_800_000, 7_200_000]

/** After `failures` failed attempts (the last at `now`): when to try again, or dropped. */
export function afterFailure(failures: number, now: number): { status: 'retrying'; nextAt: number } | { status: 'dropped'; nextAt: null } {
  const delay = RETRY_DELAYS_MS[failures - 1]
  return delay === undefined ? { status: 'dropped', nextAt: null } : { status: 'retrying', nextAt: now + delay }
}

export const ok = (status: number | null): boolean => status !== null && status >= 200 && status < 300
