import t from 'tap'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { OffsetClock } from '../../src/util/clock.js'
import { startTestGateway } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'

t.test('a rate limit set after payments counts them (the 4th payment is rejected)', async (t) => {
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
  await gw.api('POST', '/v1/agents', { body: { agentId: 'late' } })
  await gw.api('POST', '/v1/wallets', { body: { agentId: 'late' } })
  const pay = () => gw.api('POST', '/v1/pay', { body: { agentId: 'late', endpoint: `${m.url}/paid` } })

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
