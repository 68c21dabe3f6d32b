import t from 'tap'
import { decide, CHECK_ORDER } from '../../src/policy/decide.js'
import { defaultPolicy, mergePolicy } from '../../src/policy/model.js'
import { commit, emptyUsage, hold, release, usedToday, paymentsThisHour, DAY_MS, EXACT_PAYMENTS, type UsageState } from '../../src/policy/usage.js'

const now = Date.parse('2026-06-01T00:00:00Z')
const policy = (body: object) => mergePolicy(defaultPolicy(), body, 'a')
const U = 1_000_000n

t.test('no policy: everything passes', async (t) => {
  t.same(decide(defaultPolicy(), emptyUsage(), { host: 'x.com', amount: 10n ** 12n }, now), { ok: true })
})

t.test('each reason fires', async (t) => {
  const u = emptyUsage()
  const cases: [object, string, bigint, string][] = [
    [{ blockedDomains: ['example.com'] }, 'api.example.com', U, 'domain_blocked'],
    [{ allowedDomains: ['other.com'] }, 'api.example.com', U, 'domain_not_allowed'],
    [{ perCallLimit: { usdc: 0.5 } }, 'x.com', U, 'per_call_limit_exceeded'],
    [{ rateLimit: { calls: 1, window: '1m' } }, 'x.com', 1n, 'rate_limit_exceeded'],
    [{ dailyBudget: { usdc: 0.5 } }, 'x.com', U, 'daily_budget_exceeded'],
  ]
  for (const [body, host, amount, reason] of cases) {
    const usage: UsageState = reason === 'rate_limit_exceeded' ? { ...u, payments: [now - 1000] } : u
    const d = decide(policy(body), usage, { host, amount }, now)
    t.equal(d.ok ? null : d.reason, reason, reason)
    if (!d.ok) t.type(d.detail, 'string')
  }
})

t.test('documented order: blocked, not allowed, per call, rate, budget', async (t) => {
  t.same(CHECK_ORDER, ['domain_blocked', 'domain_not_allowed', 'per_call_limit_exceeded', 'rate_limit_exceeded', 'daily_budget_exceeded'])
  const all = policy({
    blockedDomains: ['bad.com'],
    allowedDomains: ['good.com', 'bad.com'],
    perCallLimit: { usdc: 1 },
    rateLimit: { calls: 1, window: '1h' },
    dailyBudget: { usdc: 1 },
  })
  const busy: UsageState = { periodStart: now - 1000, spent: String(U), payments: [now - 1000] }
  const reason = (host: string, amount: bigint) => {
    const d = decide(all, busy, { host, amount }, now)
    return d.ok ? 'ok' : d.reason
  }
  t.equal(reason('bad.com', 5n * U), 'domain_blocked', 'blocked wins over allowed')
  t.equal(reason('other.com', 5n * U), 'domain_not_allowed')
  t.equal(reason('good.com', 5n * U), 'per_call_limit_exceeded')
  t.equal(reason('good.com', U), 'rate_limit_exceeded')
  t.equal(decide({ ...all, rateLimit: undefined } as never, busy, { host: 'good.com', amount: 1n }, now).ok, false)
})

t.test('budget: exact fit passes, one unit over fails, holds count, period resets 24 h after the first payment', async (t) => {
  const p = policy({ dailyBudget: { usdc: 10 } })
  let u = emptyUsage()
  u = hold(u, { id: 'h1', amount: String(9n * U), at: now })
  t.equal(decide(p, u, { host: 'x.com', amount: U }, now).ok, true, 'exactly at the budget')
  t.equal(decide(p, u, { host: 'x.com', amount: U + 1n }, now).ok, false, 'in-flight hold counts')
  u = commit(u, 'h1', now, 10)
  t.equal(u.periodStart, now, 'the first payment opens the period')
  t.equal(usedToday(u, now), 9n * U)
  t.equal(decide(p, u, { host: 'x.com', amount: 2n * U }, now + DAY_MS - 1).ok, false, 'still in the period')
  t.equal(decide(p, u, { host: 'x.com', amount: 10n * U }, now + DAY_MS).ok, true, 'new period after 24 h')
  const later = commit(hold(u, { id: 'h2', amount: String(U), at: now + DAY_MS }), 'h2', now + DAY_MS, 10)
  t.equal(later.periodStart, now + DAY_MS)
  t.equal(usedToday(later, now + DAY_MS), U, 'usage reset')
  t.same(release(hold(u, { id: 'h3', amount: '5', at: now }), 'h3').holds, [], 'release drops the hold')
})

t.test('rate limit counts payments and in-flight holds in a sliding window', async (t) => {
  const p = policy({ rateLimit: { calls: 2, window: '1m' } })
  let u: UsageState = { periodStart: now, spent: '0', payments: [now - 70_000, now - 30_000] }
  t.equal(decide(p, u, { host: 'x.com', amount: 1n }, now).ok, true, 'the 70 s old payment left the window')
  u = hold(u, { id: 'x', amount: '1', at: now })
  t.equal(decide(p, u, { host: 'x.com', amount: 1n }, now).ok, false)
  t.equal(decide(p, u, { host: 'x.com', amount: 1n }, now + 30_001).ok, true, 'the window slides')
})

t.test('usage stays small: timestamps capped, minute buckets for the hour, hour buckets for the day', async (t) => {
  let u = emptyUsage()
  for (let i = 0; i < 500; i++) {
    u = commit(hold(u, { id: `p${i}`, amount: '1', at: now + i * 1000 }), `p${i}`, now + i * 1000, 3)
  }
  t.equal(u.payments.length, EXACT_PAYMENTS, 'a small limit keeps the fixed number of timestamps')
  t.same(u.payments.slice(-3), [now + 497_000, now + 498_000, now + 499_000], 'the newest ones, oldest first')
  t.ok((u.perMinute ?? []).length <= 61, 'at most an hour of minute buckets')
  t.ok((u.perHour ?? []).length <= 25, 'at most a day of hour buckets')
  t.equal(paymentsThisHour(u, now + 499_000), 500 - 0, 'all 500 fell within the trailing hour')
  t.equal(paymentsThisHour(u, now + 499_000 + 3_600_000), 0)
  t.equal(commit(u, 'none', now + 500_000, 0), u, 'no such hold: unchanged')
  let big = emptyUsage()
  for (let i = 0; i < 300; i++) big = commit(hold(big, { id: `p${i}`, amount: '1', at: now + i }), `p${i}`, now + i, 200)
  t.equal(big.payments.length, 200, 'a limit above the fixed number keeps as many as it allows')
})
