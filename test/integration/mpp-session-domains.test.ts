import t from 'tap'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { ProxyAgent, request } from 'undici'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startMppMerchant } from '../helpers/mpp-merchant.js'

/**
 * "A blocked or not-allowed domain gets no session reuse" (docs/payments.md): a session
 * bought before the domain was blocked is not ridden afterwards, neither on the first send
 * nor when the unpaid 402 that follows offers MPP again (the negotiation step, which looked
 * the session up anew); the agent gets the policy's 402 instead, through the proxy and
 * through POST /v1/pay alike.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const { info, fundedKey } = await testChain(gw)
const m = await startMppMerchant({
  chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token },
  facilitatorKey: await fundedKey(),
  payTo: privateKeyToAccount(generatePrivateKey()).address,
  price: '0.01',
  methods: ['tempo'],
})
t.teardown(() => m.close())
const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'sd' } })).body.apiKey as string
await gw.api('POST', '/v1/wallets', { body: { agentId: 'sd' } })
const proxy = new ProxyAgent({ uri: gw.gw.proxyUrl, token: `Basic ${Buffer.from(`sd:${key}`).toString('base64')}` })
t.teardown(() => proxy.close())

const bought = await request(`${m.url}/paid`, { dispatcher: proxy })
t.equal(bought.statusCode, 200)
t.match(bought.headers['x-paygate-tx'], /^0x[0-9a-f]{64}$/, 'a session bought through the proxy')
await bought.body.dump()

for (const [policy, reason] of [
  [{ blockedDomains: ['127.0.0.1'] }, 'domain_blocked'],
  [{ blockedDomains: [], allowedDomains: ['example.com'] }, 'domain_not_allowed'],
] as const) {
  t.test(`${reason}: the session is not ridden`, async (t) => {
    t.equal((await gw.api('PUT', '/v1/policies/sd', { body: policy })).status, 200)
    const calls = m.stats.sessionCalls
    const r = await request(`${m.url}/paid`, { dispatcher: proxy })
    t.equal(r.statusCode, 402, 'the proxy answers the policy rejection')
    t.equal(r.headers['x-paygate-error'], 'policy_violation')
    t.equal(r.headers['x-paygate-session'], undefined)
    t.match(await r.body.json(), { error: 'policy_violation', reason })
    const api = await gw.api('POST', '/v1/pay', { body: { agentId: 'sd', endpoint: `${m.url}/paid` } })
    t.equal(api.status, 402, api.text)
    t.match(api.body, { error: 'policy_violation', reason })
    t.equal(m.stats.sessionCalls, calls, 'the merchant saw no session call')
    t.equal(m.stats.payments, 1, 'and no second payment')
  })
}

t.test('allowed again: the stored session is ridden', async (t) => {
  await gw.api('PUT', '/v1/policies/sd', { body: { allowedDomains: null } })
  const r = await request(`${m.url}/paid`, { dispatcher: proxy })
  t.equal(r.statusCode, 200)
  t.equal(r.headers['x-paygate-session'], 'reused')
  await r.body.dump()
  t.equal(m.stats.payments, 1)
})
