import { storedUsage } from '../src/policy/usage-codec.js'
import { commit, hold, type UsageState } from '../src/policy/usage.js'
import { fmt } from './lib.js'

/**
 * `usage`: what writing an agent's usage costs once it has a day of history (61 minute and 25
 * hour buckets, 64 payment times): each payment's hold and commit, both encoded as the store logs
 * them, against the form stored before (times as gaps, rebuilt whole each commit; buckets as
 * JSON arrays), over the same payments, in alternating windows. Pure CPU; bounded in count and time.
 */
export function benchUsage(opts: { payments: number; windows: number; maxMs: number }): void {
  let u: UsageState = { periodStart: null, spent: '0', payments: [] }
  let now = Date.parse('2026-11-01T00:00:00Z')
  // A day and an hour of one payment a second.
  for (let i = 0; i < 90_000; i++) {
    now += 1000
    u = commit(hold(u, { id: `h${i}`, amount: '10000', at: now }), `h${i}`, now, 0)
  }
  const history = u
  const start = now
  /** The window's payments, made afresh from the history (nothing cached in a window helps the next): each one's usage before it, its hold and its commit. */
  const payments = (): [before: UsageState, held: UsageState, paid: UsageState][] => {
    let v = structuredClone(history)
    let at = start
    const out: [UsageState, UsageState, UsageState][] = []
    for (let i = 0; i < opts.payments; i++) {
      at += 1000
      const held = hold(v, { id: `p${i}`, amount: '10000', at })
      const paid = commit(held, `p${i}`, at, 0)
      out.push([v, held, paid])
      v = paid
    }
    return out
  }
  const bytes = [0, 0]
  /** One window: every payment's two writes; its ms. */
  const window = (which: 0 | 1): number => {
    const copies = payments()
    const t0 = performance.now()
    let n = 0
    for (const [before, held, paid] of copies) {
      n +=
        which === 0
          ? JSON.stringify(storedUsage(held, before)).length + JSON.stringify(storedUsage(paid, held)).length
          : JSON.stringify(earlierForm(held)).length + JSON.stringify(earlierForm(paid)).length
    }
    const ms = performance.now() - t0
    bytes[which] = n / (2 * copies.length)
    return ms
  }
  const times: [number[], number[]] = [[], []]
  const end = Date.now() + opts.maxMs
  for (let w = 0; w < opts.windows && Date.now() < end; w++) for (const which of [0, 1] as const) times[which].push(window(which))
  const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1]!
  const [stored, earlier] = [median(times[0]), median(times[1])]
  const per = (ms: number): number => (ms * 1000) / opts.payments
  console.log(`usage with a day of history, ${opts.payments} payments a window, ${times[0].length} windows each (a hold and a commit written per payment):`)
  console.log(`  as stored: ${fmt(per(stored), 2)} us a payment (median window), ${fmt(bytes[0]!, 0)} characters a write`)
  console.log(`  the earlier form: ${fmt(per(earlier), 2)} us a payment, ${fmt(bytes[1]!, 0)} characters a write`)
  console.log(`  ratio stored/earlier: time ${fmt(stored / earlier)}x, size ${fmt(bytes[0]! / bytes[1]!)}x`)
}

/** The form stored before: payment times as gaps, encoded whole (the hold shares the commit's), buckets as arrays. */
const earlierTimes = new WeakMap<number[], string>()
function earlierForm(u: UsageState): unknown {
  let s = earlierTimes.get(u.payments)
  if (s === undefined) {
    s = ''
    for (let i = 0; i < u.payments.length; i++) s += i ? `,${u.payments[i]! - u.payments[i - 1]!}` : `${u.payments[i]}`
    earlierTimes.set(u.payments, s)
  }
  return { ...u, payments: s }
}
