import t from 'tap'
import { defaultPolicy, mergePolicy, policyView } from '../../src/policy/model.js'
import { emptyUsage, DAY_MS, HOUR_MS, usedToday, paymentsWithin } from '../../src/policy/usage.js'
import { PaygateError } from '../../src/errors/index.js'

const base = defaultPolicy()

t.test('valid updates merge, null removes', async (t) => {
  let p = mergePolicy(
    base,
    {
      dailyBudget: { usdc: 10 },
      perCallLimit: { usdc: 0.05 },
      allowedDomains: ['Example.com', 'api.other.io', 'example.com'],
      blockedDomains: ['bad.example.com'],
      rateLimit: { calls: 100, window: '1h' },
      protocolPreference: 'x402',
    },
    'a1',
  )
  t.equal(p.dailyBudget, '10000000')
  t.equal(p.perCallLimit, '50000')
  t.same(p.allowedDomains, ['example.com', 'api.other.io'], 'normalised and de-duplicated')
  t.same(p.blockedDomains, ['bad.example.com'])
  t.same(p.rateLimit, { calls: 100, window: '1h' })
  t.equal(p.protocolPreference, 'x402')
  p = mergePolicy(p, { perCallLimit: { usdc: '0.5' } }, 'a1')
  t.equal(p.perCallLimit, '500000', 'string amounts accepted; other fields kept')
  t.equal(p.dailyBudget, '10000000')
  p = mergePolicy(p, { dailyBudget: null, allowedDomains: null, blockedDomains: null, rateLimit: null, protocolPreference: null, perCallLimit: null }, 'a1')
  t.same(p, { blockedDomains: [], protocolPreference: 'auto' })
})

t.test('a GET body can be sent back unchanged', async (t) => {
  const p = mergePolicy(base, { dailyBudget: { usdc: 5 }, rateLimit: { calls: 3, window: '1m' } }, 'a1')
  const view = policyView('a1', p, emptyUsage(), Date.now())
  const again = mergePolicy(p, JSON.parse(JSON.stringify(view)), 'a1')
  t.same(again, p)
})

t.test('validation table names the field', async (t) => {
  const bad: [unknown, string][] = [
    [[], 'body'],
    ['x', 'body'],
    [{ dailyBudget: 10 }, 'dailyBudget'],
    [{ dailyBudget: { usdc: 0 } }, 'dailyBudget.usdc'],
    [{ dailyBudget: { usdc: -1 } }, 'dailyBudget.usdc'],
    [{ dailyBudget: { usdc: 0.0000001 } }, 'dailyBudget.usdc'],
    [{ dailyBudget: { usdc: 'ten' } }, 'dailyBudget.usdc'],
    [{ dailyBudget: { usdc: true } }, 'dailyBudget.usdc'],
    [{ dailyBudget: { usdc: 1e13 } }, 'dailyBudget.usdc'],
    // biome-ignore lint/correctness/noPrecisionLoss: a number a double cannot hold exactly is what this case checks is refused
    [{ dailyBudget: { usdc: 999999999999.999999 } }, 'dailyBudget.usdc'],
    // biome-ignore lint/correctness/noPrecisionLoss: as above, just under the cap
    [{ dailyBudget: { usdc: 8999999999.999999 } }, 'dailyBudget.usdc'],
    [{ perCallLimit: { usdc: 1.2345678 } }, 'perCallLimit.usdc'],
    [{ perCallLimit: {} }, 'perCallLimit'],
    [{ allowedDomains: 'example.com' }, 'allowedDomains'],
    [{ allowedDomains: ['https://example.com'] }, 'allowedDomains[0]'],
    [{ allowedDomains: ['ok.com', '*.example.com'] }, 'allowedDomains[1]'],
    [{ blockedDomains: [42] }, 'blockedDomains[0]'],
    [{ blockedDomains: ['example.com:8080'] }, 'blockedDomains[0]'],
    [{ rateLimit: { calls: 0, window: '1h' } }, 'rateLimit.calls'],
    [{ rateLimit: { calls: 1.5, window: '1h' } }, 'rateLimit.calls'],
    [{ rateLimit: { calls: 10, window: '2h' } }, 'rateLimit.window'],
    [{ rateLimit: { calls: 10 } }, 'rateLimit.window'],
    [{ rateLimit: [] }, 'rateLimit'],
    [{ protocolPreference: 'bitcoin' }, 'protocolPreference'],
    [{ blockedDomains: ['ads.example.com\\.evil'] }, 'blockedDomains[0]'],
    [{ allowedDomains: ['ok.com', '%41.com'] }, 'allowedDomains[1]'],
    [{ allowedDomains: ['123'] }, 'allowedDomains[0]'],
    [{ blockedDomains: ['1.2.3'] }, 'blockedDomains[0]'],
    [{ dailyBudget: { usdc: 5, foo: 1 } }, 'dailyBudget.foo'],
    [{ dailyBudget: { foo: 1 } }, 'dailyBudget.foo'],
    [{ perCallLimit: { usdc: 1, usedToday: 0 } }, 'perCallLimit.usedToday'],
    [{ rateLimit: { calls: 10, window: '1h', burst: 5 } }, 'rateLimit.burst'],
    [{ maxSpend: 1 }, 'maxSpend'],
    [{ agentId: 'other' }, 'agentId'],
  ]
  for (const [body, field] of bad) {
    let err: unknown
    try {
      mergePolicy(base, body, 'a1')
    } catch (e) {
      err = e
    }
    t.ok(err instanceof PaygateError && err.code === 'invalid_request', `${JSON.stringify(body)} is rejected`)
    t.equal((err as PaygateError).extra.field, field, `${JSON.stringify(body)} names ${field}`)
  }
})

t.test('view shows usage from stored payments', async (t) => {
  const now = Date.parse('2026-05-01T12:00:00Z')
  const p = mergePolicy(base, { dailyBudget: { usdc: 10 }, rateLimit: { calls: 5, window: '1m' } }, 'a1')
  const usage = {
    periodStart: now - 2 * HOUR_MS,
    spent: '2500000',
    payments: [now - 2 * HOUR_MS, now - 30 * 60_000, now - 1000],
    perMinute: [
      [now - 2 * HOUR_MS, 1],
      [now - 30 * 60_000, 1],
      [now - 60_000, 1],
    ] as [number, number][],
  }
  const v = policyView('a1', p, usage, now) as any
  t.same(v.dailyBudget, { usdc: 10, usedToday: 2.5 })
  t.same(v.rateLimit, { calls: 5, window: '1m', usedThisHour: 2 })
  t.notOk('allowedDomains' in v, 'absent allowlist means any domain')
  t.same(v.blockedDomains, [])
  t.equal(v.protocolPreference, 'auto')
  t.equal(usedToday(usage, now + DAY_MS), 0n, 'period over: usage resets')
  t.equal(paymentsWithin(usage, now, 60_000), 1)
})

t.test('a large amount is exact as a decimal string', async (t) => {
  t.equal(mergePolicy(defaultPolicy(), { dailyBudget: { usdc: '999999999999.999999' } }, 'a').dailyBudget, '999999999999999999')
  t.equal(mergePolicy(defaultPolicy(), { dailyBudget: { usdc: 8589934591.999999 } }, 'a').dailyBudget, '8589934591999999', 'the largest number accepted, exact')
  t.equal(mergePolicy(defaultPolicy(), { dailyBudget: { usdc: '8999999999.999999' } }, 'a').dailyBudget, '8999999999999999')
})
