import t from 'tap'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { OffsetClock } from '../../src/util/clock.js'
import { startTestGateway } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'


t.test('the daily budget period starts at the first payment and resets 24 h later', async (t) => {
  const clock = new OffsetClock()
  const gw = await startTestGateway({ clock })
  t.teardown(() => gw.close())
  const info = (await gw.api('GET', '/v1/chain')).body
  const facilitatorKey = generatePrivateKey()
  await gw.gw.chain.publicClient.request({ method: 'anvil_setBalance' as never, params: [privateKeyToAccount(facilitatorKey).address, '0x56bc75e2d63100000'] as never })
  const m = await startV2Merchant({
    chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token },
    facilitatorKey,
    payTo: privateKeyToAccount(generatePrivateKey()).address,
    price: 10_000n,
  })
  t.teardown(() => m.close())
  await gw.api('POST', '/v1/agents', { body: { agentId: 'daily' } })
  await gw.api('POST', '/v1/wallets', { body: { agentId: 'daily' } })
  await gw.api('PUT', '/v1/policies/daily', { body: { dailyBudget: { usdc: 0.02 } } })
  const pay = () => gw.api('POST', '/v1/pay', { body: { agentId: 'daily', endpoint: `${m.url}/paid` } })

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
