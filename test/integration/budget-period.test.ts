import t from 'tap'
import { clockedPayer } from '../helpers/clocked-payer.js'

t.test('the daily budget period starts at the first payment and resets 24 h later', async (t) => {
  const { gw, clock, merchant: m, pay } = await clockedPayer(t, 'daily')
  await gw.api('PUT', '/v1/policies/daily', { body: { dailyBudget: { usdc: 0.02 } } })

  t.equal((await pay()).status, 200)
  clock.offset += 12 * 3_600_000
  t.equal((await pay()).status, 200, 'second payment 12 h later, same period')
  const full = await pay()
  t.same([full.status, full.body.reason], [402, 'daily_budget_exceeded'])
  t.match((await gw.api('GET', '/v1/policies/daily')).body.dailyBudget, { usedToday: 0.02 })

  clock.offset += 12 * 3_600_000 - 60_000
  t.equal((await pay()).body.reason, 'daily_budget_exceeded', 'one minute before the reset: still exhausted')
  clock.offset += 60_000
  t.match((await gw.api('GET', '/v1/policies/daily')).body.dailyBudget, { usedToday: 0 }, '24 h after the first payment: usage resets')
  t.equal((await pay()).status, 200, 'and a payment goes through')
  t.equal(m.stats.settlements, 3)
})
