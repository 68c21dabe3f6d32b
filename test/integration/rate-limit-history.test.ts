import t from 'tap'
import { clockedPayer } from '../helpers/clocked-payer.js'

t.test('a rate limit set after payments counts them (the 4th payment is rejected)', async (t) => {
  const { gw, clock, merchant: m, pay } = await clockedPayer(t, 'late')

  for (let i = 0; i < 3; i++) t.equal((await pay()).status, 200, `payment ${i + 1} with no rate limit`)
  t.equal((await gw.api('PUT', '/v1/policies/late', { body: { rateLimit: { calls: 3, window: '1h' } } })).status, 200)
  for (const n of [4, 5]) {
    const r = await pay()
    t.same([r.status, r.body.error, r.body.reason], [402, 'policy_violation', 'rate_limit_exceeded'], `payment ${n} is rejected`)
  }
  t.match((await gw.api('GET', '/v1/policies/late')).body.rateLimit, { calls: 3, usedThisHour: 3 })

  t.equal((await gw.api('PUT', '/v1/policies/late', { body: { rateLimit: { calls: 4, window: '1h' } } })).status, 200)
  t.equal((await pay()).status, 200, 'raised to 4: one more')
  t.equal((await pay()).body.reason, 'rate_limit_exceeded', 'and then rejected')
  clock.offset += 3_600_000
  t.equal((await pay()).status, 200, 'an hour later the window has slid')
  t.equal(m.stats.settlements, 5)
})
