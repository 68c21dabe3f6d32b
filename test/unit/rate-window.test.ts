import t from 'tap'
import { decide } from '../../src/policy/decide.js'
import { defaultPolicy, mergePolicy, RATE_WINDOWS, type RateWindow, type StoredPolicy } from '../../src/policy/model.js'
import { commit, emptyUsage, hold, paymentsWithin, DAY_MS, EXACT_PAYMENTS, HOUR_MS, type UsageState } from '../../src/policy/usage.js'

const start = Date.parse('2026-06-01T00:00:00Z')
const MIN = 60_000
const policy = (body: object) => mergePolicy(defaultPolicy(), body, 'a')
const noLimit = defaultPolicy()

/** One payment as the engine makes it: decide, hold, commit with the policy of the moment. */
function pay(p: StoredPolicy, u: UsageState, at: number, id = `p${at}`): { ok: boolean; u: UsageState } {
  if (!decide(p, u, { host: 'x.com', amount: 1n }, at).ok) return { ok: false, u }
  return { ok: true, u: commit(hold(u, { id, amount: '1', at }), id, at, p.rateLimit?.calls ?? 0) }
}

/** Payments at `times` under `p`; all must be allowed. */
function payAll(p: StoredPolicy, u: UsageState, times: number[]): UsageState {
  for (const at of times) {
    const r = pay(p, u, at)
    if (!r.ok) throw new Error(`payment at ${at} rejected`)
    u = r.u
  }
  return u
}

/** How many more payments at `at` the policy allows (stops at `max`). */
function allowedNow(p: StoredPolicy, u: UsageState, at: number, max = 10_000): { n: number; u: UsageState } {
  let n = 0
  for (; n < max; n++) {
    const r = pay(p, u, at, `more${at}-${n}`)
    if (!r.ok) break
    u = r.u
  }
  return { n, u }
}

t.test('payments made with no limit count once a limit is set (the audited case)', async (t) => {
  const u = payAll(noLimit, emptyUsage(), [start, start + 1000, start + 2000])
  const limited = policy({ rateLimit: { calls: 3, window: '1h' } })
  const d = decide(limited, u, { host: 'x.com', amount: 1n }, start + 3000)
  t.same(d, { ok: false, reason: 'rate_limit_exceeded', detail: '3 payments in the last 1h reach the limit of 3' }, 'the 4th is rejected')
  t.equal(allowedNow(limited, u, start + 4000).n, 0, 'and so is the 5th')
  t.equal(allowedNow(limited, u, start + HOUR_MS).n, 1, 'an hour after the first, one more')
})

t.test('more unlimited payments than the timestamps kept still count (minute buckets)', async (t) => {
  const times = Array.from({ length: 150 }, (_, i) => start + i * 2000) // 150 payments over 5 minutes
  const u = payAll(noLimit, emptyUsage(), times)
  t.equal(u.payments.length, EXACT_PAYMENTS, 'no limit: the fixed number of timestamps')
  const now = start + 5 * MIN
  t.equal(paymentsWithin(u, now, HOUR_MS), 150, 'all 150 counted in the hour')
  t.equal(allowedNow(policy({ rateLimit: { calls: 150, window: '1h' } }), u, now).n, 0, 'a limit of 150/1h: rejected')
  t.equal(allowedNow(policy({ rateLimit: { calls: 151, window: '1h' } }), u, now).n, 1, 'a limit of 151/1h: exactly one more')
  t.equal(allowedNow(policy({ rateLimit: { calls: 100, window: '15m' } }), u, now).n, 0, 'a lower 15m limit: rejected')
})

t.test('a raised limit counts the payments made under the lower one', async (t) => {
  // 100/1m for 10 minutes: 1,000 payments, only the last 100 timestamps kept.
  const low = policy({ rateLimit: { calls: 100, window: '1m' } })
  const times = Array.from({ length: 1000 }, (_, i) => start + Math.floor(i / 100) * MIN + (i % 100) * 500)
  let u = payAll(low, emptyUsage(), times)
  t.equal(u.payments.length, 100)
  t.equal(allowedNow(low, u, start + 9 * MIN + 50_000).n, 0, 'the low limit is reached in the 10th minute')
  const raised = policy({ rateLimit: { calls: 1500, window: '1h' } })
  const now = start + 10 * MIN
  const r = allowedNow(raised, u, now)
  t.equal(r.n, 500, 'raised to 1500/1h: 500 more, not 1500')
  u = r.u
  t.equal(u.payments.length, 600, 'the raised limit keeps more timestamps from now on')
  t.equal(allowedNow(raised, u, start + HOUR_MS - 1).n, 0, 'still full while the first payment is in the window')
  // At start + 1h + 1 min + 1 ms the first minute's 100 payments have left the window, but the
  // bucket of the second minute is counted whole though half of it has left too.
  t.equal(allowedNow(raised, u, start + HOUR_MS + MIN + 1).n, 100, 'the window slides by whole minute buckets at worst')
  t.equal(allowedNow(raised, u, start + HOUR_MS + 10 * MIN - 1).n, 1000, 'an hour after the low-limit minutes only the 500 made since count')
})

t.test('24 h window with more payments than the timestamps kept (hour buckets), and sliding', async (t) => {
  // One payment every 6 minutes for 20 h with no limit: 200 payments.
  const times = Array.from({ length: 200 }, (_, i) => start + i * 6 * MIN)
  const u = payAll(noLimit, emptyUsage(), times)
  t.equal(u.payments.length, EXACT_PAYMENTS)
  t.ok((u.perHour ?? []).length <= 25)
  const now = start + 20 * HOUR_MS
  t.equal(paymentsWithin(u, now, DAY_MS), 200)
  t.equal(allowedNow(policy({ rateLimit: { calls: 200, window: '24h' } }), u, now).n, 0, '200/24h: rejected')
  t.equal(allowedNow(policy({ rateLimit: { calls: 205, window: '24h' } }), u, now).n, 5, '205/24h: 5 more')
  // Window (start + 1h, start + 25h]: the first hour's 10 payments no longer count.
  t.equal(paymentsWithin(u, start + 25 * HOUR_MS, DAY_MS), 190, 'the first hour left the window')
  t.equal(allowedNow(policy({ rateLimit: { calls: 200, window: '24h' } }), u, start + 25 * HOUR_MS).n, 10)
  // Half way through, the straddling hour bucket still counts whole: never fewer than made.
  const mid = start + 24 * HOUR_MS + 30 * MIN
  const made = times.filter((x) => x > mid - DAY_MS).length
  t.equal(made, 194)
  t.equal(paymentsWithin(u, mid, DAY_MS), 200, 'the straddling hour is counted whole (errs toward rejecting)')
  t.equal(paymentsWithin(u, start + 44 * HOUR_MS, DAY_MS), 0, 'a day after the last payment nothing counts')
})

t.test('short windows slide: old payments stop counting', async (t) => {
  const u = payAll(
    noLimit,
    emptyUsage(),
    Array.from({ length: 80 }, (_, i) => start + i * 100),
  ) // 80 in 8 s
  const p = policy({ rateLimit: { calls: 10, window: '5m' } })
  t.equal(allowedNow(p, u, start + 4 * MIN).n, 0)
  t.equal(allowedNow(p, u, start + 5 * MIN + 7_899).n, 9, 'the last one is still in the window')
  t.equal(allowedNow(p, u, start + 5 * MIN + 7_900).n, 10, 'all 80 left the window')
  const one = policy({ rateLimit: { calls: 1, window: '1m' } })
  t.equal(allowedNow(one, u, start + MIN + 7_899).n, 0)
  t.equal(allowedNow(one, u, start + MIN + 7_900).n, 1)
})

t.test('usage written before hour buckets and wider timestamp lists is still read', async (t) => {
  const now = start + 30 * MIN
  // No limit then: no timestamps, minute buckets only.
  const old: UsageState = {
    periodStart: start,
    spent: '5',
    payments: [],
    perMinute: [
      [start, 3],
      [start + 10 * MIN, 2],
    ],
  }
  t.equal(paymentsWithin(old, now, HOUR_MS), 5)
  t.equal(decide(policy({ rateLimit: { calls: 5, window: '1h' } }), old, { host: 'x.com', amount: 1n }, now).ok, false)
  t.equal(decide(policy({ rateLimit: { calls: 6, window: '1h' } }), old, { host: 'x.com', amount: 1n }, now).ok, true)
  // Trimmed to an old limit of 2.
  const trimmed: UsageState = { ...old, payments: [start + 10 * MIN, start + 10 * MIN + 1] }
  t.equal(paymentsWithin(trimmed, now, HOUR_MS), 5)
  t.equal(paymentsWithin(trimmed, now, 15 * MIN), 0)
  const next = commit(hold(old, { id: 'h', amount: '1', at: now }), 'h', now, 0)
  t.same(next.payments, [now])
  t.same(next.perHour, [[start, 1]], 'hour buckets start with the next payment')
  t.equal(paymentsWithin(next, now, HOUR_MS), 6)
})

t.test('randomized: the count is never below the payments made in the window, and at most one bucket above', async (t) => {
  let seed = 42
  const rand = () => (seed = (seed * 16807) % 2147483647) / 2147483647
  const windows = Object.keys(RATE_WINDOWS) as RateWindow[]
  for (let run = 0; run < 20; run++) {
    let u = emptyUsage()
    const made: number[] = []
    let at = start + Math.floor(rand() * HOUR_MS)
    let calls = 0
    for (let i = 0; i < 400; i++) {
      at += Math.floor(rand() ** 4 * 20 * MIN) // bursts and gaps
      if (rand() < 0.02) calls = rand() < 0.3 ? 0 : 1 + Math.floor(rand() * 150) // the limit changes now and then
      const id = `r${i}`
      u = commit(hold(u, { id, amount: '1', at }), id, at, calls)
      made.push(at)
      for (const w of windows) {
        const ms = RATE_WINDOWS[w]
        const now = at + Math.floor(rand() * ms)
        const exact = made.filter((x) => x > now - ms && x <= now).length
        const size = ms <= HOUR_MS ? MIN : HOUR_MS
        const edge = now - ms - ((now - ms) % size)
        const slack = made.filter((x) => x >= edge && x <= now - ms).length
        const got = paymentsWithin(u, now, ms)
        if (got < exact || got > exact + slack) t.fail(`run ${run} payment ${i} window ${w}: counted ${got}, made ${exact}, slack ${slack}`)
        if (calls > 0 && u.payments.length >= calls && exact < calls && got >= calls) t.fail(`run ${run} payment ${i} window ${w}: a standing limit was decided inexactly`)
      }
    }
    t.ok(u.payments.length <= Math.max(EXACT_PAYMENTS, 150) && (u.perMinute ?? []).length <= 61 && (u.perHour ?? []).length <= 25, `run ${run}: usage stays small`)
  }
})
