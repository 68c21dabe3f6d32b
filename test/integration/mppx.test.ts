import t from 'tap'
import type { Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { ProxyAgent, request } from 'undici'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startFakeCardProvider } from '../helpers/mpp-merchant.js'
import { startMppxMerchant, type MppxMerchant, type MppxMerchantOptions } from '../helpers/mppx-merchant.js'

/** The published MPP protocol (HTTP "Payment" auth) against a real mppx server settling on the embedded chain. */
const card = await startFakeCardProvider()
t.teardown(() => card.close())
const gw = await startTestGateway({ env: { PAYGATE_MPP_CARD_PROVIDER_URL: card.url, PAYGATE_PAY_TIMEOUT_MS: '3000' } })
t.teardown(() => gw.close())
const { info, balanceOf, fundedKey } = await testChain(gw)

const merchants: MppxMerchant[] = []
t.teardown(async () => {
  for (const m of merchants) await m.close()
})
async function merchant(o: Partial<MppxMerchantOptions> = {}): Promise<{ m: MppxMerchant; recipient: Hex }> {
  const facilitatorKey = await fundedKey()
  const recipient = privateKeyToAccount(generatePrivateKey()).address
  const m = await startMppxMerchant({ chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token }, facilitatorKey, recipient, price: '0.01', card, ...o })
  merchants.push(m)
  return { m, recipient }
}
let n = 0
async function agent(protocolPreference = 'mpp'): Promise<{ id: string; key: string; wallet: Hex }> {
  const id = `mppx-${++n}`
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: id } })).body.apiKey
  const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: id } })).body.address
  await gw.api('PUT', `/v1/policies/${id}`, { body: { protocolPreference } })
  return { id, key, wallet }
}
const pay = (agentId: string, endpoint: string) => gw.api('POST', '/v1/pay', { body: { agentId, endpoint, method: 'GET' } })

t.test('evm/charge through POST /v1/pay: EIP-3009 settled by the mppx server, Payment-Receipt kept', async (t) => {
  const { m, recipient } = await merchant()
  const a = await agent()
  const before = await balanceOf(a.wallet)
  const r = await pay(a.id, `${m.url}/evm`)
  t.equal(r.status, 200, r.text)
  t.match(r.body, { protocol: 'mpp', amountPaid: { usdc: 0.01 }, rail: 'stablecoin', status: 200, data: { ok: true, paid: 'mppx' } })
  t.equal(m.stats.credentials.length, 1, 'one credential')
  t.equal(m.stats.settlements.length, 1)
  t.equal(r.body.settlement.transaction, m.stats.settlements[0], 'the receipt reference is the settlement')
  t.equal(await balanceOf(a.wallet), before - 10_000n)
  t.equal(await balanceOf(recipient), 10_000n)
  t.equal(m.stats.acceptPayment[0], 'evm/charge, stripe/charge;q=0.5', 'Accept-Payment lists what Paygate can pay')
  const tx = (await gw.api('GET', `/v1/transactions/${r.body.txHash}`)).body
  t.match(tx, { protocol: 'mpp', rail: 'stablecoin', paymentMethod: 'evm/charge', status: 'paid', settlement: { success: true, transaction: m.stats.settlements[0] } })
})

t.test('stripe/charge through the card rail (fake Stripe client, fake card provider)', async (t) => {
  const { m } = await merchant()
  const a = await agent()
  const before = await balanceOf(a.wallet)
  const r = await pay(a.id, `${m.url}/stripe`)
  t.equal(r.status, 200, r.text)
  t.match(r.body, { protocol: 'mpp', amountPaid: { usdc: 0.5 }, rail: 'card', settlement: { success: true, transaction: 'pi_test_1' } })
  t.equal(m.stats.stripeCharges, 1)
  t.equal(await balanceOf(a.wallet), before, 'the wallet is not charged')
})

t.test('several offers in one WWW-Authenticate header (quoted commas included): the stablecoin one is paid', async (t) => {
  const { m } = await merchant()
  const a = await agent()
  const r = await pay(a.id, `${m.url}/multi`)
  t.equal(r.status, 200, r.text)
  t.match(r.body, { rail: 'stablecoin', amountPaid: { usdc: 0.01 } })
  t.equal(m.stats.settlements.length, 1)
  t.equal(m.stats.stripeCharges, 0)
})

t.test('an expired challenge is fetched again, never paid', async (t) => {
  const { m } = await merchant()
  const a = await agent()
  const r = await pay(a.id, `${m.url}/stale`)
  t.equal(r.status, 200, r.text)
  t.equal(m.stats.challenges, 2, 'the 402 was fetched twice')
  t.equal(m.stats.credentials.length, 1, 'only the fresh challenge was answered')
  t.equal(m.stats.settlements.length, 1)
})

t.test('a transient failure resends the same credential: one settlement', async (t) => {
  const { m, recipient } = await merchant({ faults: { fail503Once: true } })
  const a = await agent()
  const r = await pay(a.id, `${m.url}/evm`)
  t.equal(r.status, 200, r.text)
  t.equal(m.stats.credentials.length, 2)
  t.equal(m.stats.credentials[0], m.stats.credentials[1], 'byte-identical credential')
  t.equal(m.stats.settlements.length, 1)
  t.equal(await balanceOf(recipient), 10_000n)
})

t.test('answer lost after settlement: the chain says paid, no resend; a replay of the credential is refused', async (t) => {
  const { m, recipient } = await merchant({ faults: { dropAfterSettleOnce: true } })
  const a = await agent()
  const r = await pay(a.id, `${m.url}/evm`)
  t.equal(r.status, 200, r.text)
  t.match(r.body, { amountPaid: { usdc: 0.01 }, status: 502, data: { error: 'upstream_answer_lost' } })
  t.equal(m.stats.credentials.length, 1, 'never resent once the money moved')
  const replay = await request(`${m.url}/evm`, { headers: { authorization: m.stats.credentials[0]! } })
  t.equal(replay.statusCode, 402)
  const problem = (await replay.body.json()) as { type: string }
  t.equal(problem.type, 'https://paymentauth.org/problems/verification-failed', 'the server refuses the replayed credential')
  t.equal(m.stats.settlements.length, 1)
  t.equal(await balanceOf(recipient), 10_000n, 'paid once')
})

t.test('preference on a target offering x402 v2 and the Payment scheme (mppx emits both)', async (t) => {
  for (const [pref, want] of [
    ['auto', 'x402'],
    ['x402', 'x402'],
    ['mpp', 'mpp'],
  ] as const) {
    const { m, recipient } = await merchant()
    const a = await agent(pref)
    const r = await pay(a.id, `${m.url}/evm`)
    t.equal(r.status, 200, r.text)
    t.equal(r.body.protocol, want, `${pref} -> ${want}`)
    t.equal(want === 'x402' ? m.stats.x402Credentials : m.stats.credentials.length, 1)
    t.equal(want === 'x402' ? m.stats.credentials.length : m.stats.x402Credentials, 0)
    t.equal(await balanceOf(recipient), 10_000n)
  }
})

t.test('through the proxy: an unmodified client pays evm/charge', async (t) => {
  const { m, recipient } = await merchant()
  const a = await agent()
  const proxy = new ProxyAgent({ uri: gw.gw.proxyUrl, token: `Basic ${Buffer.from(`${a.id}:${a.key}`).toString('base64')}` })
  t.teardown(() => proxy.close())
  const r = await request(`${m.url}/evm`, { dispatcher: proxy })
  t.equal(r.statusCode, 200)
  t.same(await r.body.json(), { ok: true, paid: 'mppx', path: '/evm' })
  t.equal(r.headers['x-paygate-protocol'], 'mpp')
  t.equal(r.headers['x-paygate-amount'], '0.01')
  t.ok(r.headers['payment-receipt'], "the target's receipt reaches the agent")
  t.equal(await balanceOf(recipient), 10_000n)
})
