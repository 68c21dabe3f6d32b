import type { UsageState } from './usage.js'

/**
 * Usage as stored: the payment times are one string, the first time then the gaps between
 * times (`"1795816066731,1,2,1"`), where a JSON array of times took 14 characters a payment.
 * Usage is written twice a payment (its hold, its commit), so this was a kilobyte of JSON to
 * make and log each time, and number formatting at that. Records of earlier versions, with the
 * times as an array, are read as they are.
 */
export type StoredUsage = Omit<UsageState, 'payments'> & { payments: number[] | string }

/**
 * The encoding of each payments array, kept while the array lives: a hold shares its usage's
 * array, so its write reuses the commit's. (Usage is replaced, never changed in place.)
 */
const encoded = new WeakMap<number[], string>()

/** Times as gaps; whole milliseconds only (fractions would add up rounding errors: kept as an array). */
function encodeTimes(times: number[]): string | number[] {
  let s = encoded.get(times)
  if (s !== undefined) return s
  if (!times.every(Number.isSafeInteger)) return times
  s = ''
  let prev = 0
  for (let i = 0; i < times.length; i++) {
    const t = times[i]!
    s += i ? `,${t - prev}` : `${t}`
    prev = t
  }
  encoded.set(times, s)
  return s
}

function decodeTimes(s: string): number[] {
  if (!s) return []
  const times: number[] = []
  let prev = 0
  for (const part of s.split(',')) {
    prev += Number(part)
    times.push(prev)
  }
  return times
}

export function storedUsage(u: UsageState): StoredUsage {
  return { ...u, payments: encodeTimes(u.payments) }
}

export function usageFromStore(s: StoredUsage): UsageState {
  return typeof s.payments === 'string' ? { ...s, payments: decodeTimes(s.payments) } : (s as UsageState)
}
