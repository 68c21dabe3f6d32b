import t from 'tap'
import { decodeEventLog, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { ProxyAgent, request } from 'undici'
import { paymentLedgerAbi } from '../../src/chain/contracts/abis.js'
import type { Rail, RailCharge } from '../../src/engine/rails.js'
import { OffsetClock } from '../../src/util/clock.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startFakeCardProvider, startMppMerchant, type MppMerchant, type MppMerchantOptions } from '../helpers/mpp-merchant.js'

const clock = new OffsetClock()
const card = await startFakeCardProvider({ key: 'card-secret-key' })
t.teardown(() => card.close())
const gw = await startTestGateway({
  clock,
  env: { PAYGATE_MPP_CARD_PROVIDER_URL: card.url, PAYGATE_MPP_CARD_PROVIDER_KEY: 'card-secret-key', PAYGATE_PAY_TIMEOUT_MS: '3000', PAYGATE_MPP_RATES: 'EUR=1.5' },
})
t.teardown(() => gw.close())
const { info, pub, balanceOf, fundedKey } = await testChain(gw)

const merchants: MppMerchant[] = []
t.teardown(async () => {
  for (const m of merchants) await m.close()
})
async function merchant(o: Partial<MppMerchantOptions> = {}): Promise<{ m: MppMerchant; payTo: Hex }> {
  const facilitatorKey = await fundedKey()
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const m = await startMppMerchant({ chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token }, facilitatorKey, payTo, price: '0.01', methods: ['tempo', 'stripe'], card, ...o })
  merchants.push(m)
  return { m, payTo }
}
let agents = 0
async function agent(policy?: object): Promise<{ id: string; key: string; wallet: Hex }> {
  const id = `mpp-${++agents}`
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: id } })).body.apiKey
  const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: id } })).body.address
  if (policy) await gw.api('PUT', `/v1/policies/${id}`, { body: policy })
  return { id, key, wallet }
}
const pay = (agentId: string, endpoint: string, extra: object = {}) => gw.api('POST', '/v1/pay', { body: { agentId, endpoint, method: 'GET', ...extra } })

async function ledgerProtocol(txHash: Hex): Promise<string> {
  const receipt = await pub.waitForTransactionReceipt({ hash: txHash, timeout: 20_000 })
  const log = receipt.logs.find((l) => l.address.toLowerCase() === info.ledger.toLowerCase())!
  const ev = decodeEventLog({ abi: paymentLedgerAbi, data: log.data, topics: log.topics })
  return (ev.args as { protocol: string }).protocol
}

t.test('stablecoin rail with payTo: EIP-3009 settled on chain, a session bought, the next call pays nothing', async (t) => {
  const { m, payTo } = await merchant()
  const a = await agent()
  const before = await balanceOf(a.wallet)
  const r = await pay(a.id, `${m.url}/paid`)
  t.equal(r.status, 200, r.text)
  t.match(r.body, { protocol: 'mpp', amountPaid: { usdc: 0.01 }, status: 200, data: { ok: true, paid: 'mpp', method: 'tempo' }, rail: 'stablecoin' })
  t.match(r.body.txHash, /^0x[0-9a-f]{64}$/)
  t.equal(m.stats.settlements, 1, 'settled on chain by the merchant')
  t.equal(await balanceOf(a.wallet), before - 10_000n)
  t.equal(await balanceOf(payTo), 10_000n)
  t.equal(await ledgerProtocol(r.body.txHash), 'mpp', 'the ledger records protocol mpp')
  const tx = (await gw.api('GET', `/v1/transactions/${r.body.txHash}`)).body
  t.match(tx, { status: 'paid', protocol: 'mpp', rail: 'stablecoin', paymentMethod: 'tempo', amountPaid: { usdc: 0.01 } })

  const again = await pay(a.id, `${m.url}/paid`)
  t.equal(again.status, 200)
  t.same({ ...again.body, data: undefined }, { protocol: 'mpp', amountPaid: { usdc: 0 }, txHash: null, status: 200, data: undefined, session: 'reused' })
  t.equal(m.stats.payments, 1, 'no second payment')
  t.equal(m.stats.sessionCalls, 1)
  t.equal(await balanceOf(a.wallet), before - 10_000n)
  const policy = (await gw.api('GET', `/v1/policies/${a.id}`)).body
  t.same(policy.sessionCalls, { total: 1, last24h: 1 }, 'counted as a session call')
  const list = (await gw.api('GET', `/v1/transactions?agentId=${a.id}`)).body.transactions
  t.equal(list.length, 1, 'a session call is not a transaction')
})

t.test('stablecoin rail without payTo: an EIP-712 payment intent the merchant verifies by recovery', async (t) => {
  const { m } = await merchant({ payTo: null })
  const a = await agent()
  const before = await balanceOf(a.wallet)
  const r = await pay(a.id, `${m.url}/paid`)
  t.equal(r.status, 200, r.text)
  t.match(r.body, { protocol: 'mpp', amountPaid: { usdc: 0.01 }, rail: 'stablecoin' })
  t.equal(m.stats.intents, 1)
  t.equal(m.stats.settlements, 0, 'nothing settled on chain by the intent itself')
  t.equal(await balanceOf(a.wallet), before)
  t.equal(await ledgerProtocol(r.body.txHash), 'mpp', 'still recorded on the ledger')
})

t.test('card rail: used only when no stablecoin method is offered, through the configured provider', async (t) => {
  const { m } = await merchant({ methods: ['stripe'] })
  const a = await agent()
  const before = await balanceOf(a.wallet)
  const issued = card.issued.size
  const r = await pay(a.id, `${m.url}/paid`)
  t.equal(r.status, 200, r.text)
  t.match(r.body, { protocol: 'mpp', amountPaid: { usdc: 0.01 }, rail: 'card', data: { method: 'stripe' } })
  t.equal(card.issued.size, issued + 1, 'one token from the provider')
  t.equal(m.stats.cardCharges, 1)
  t.equal(await balanceOf(a.wallet), before, 'the wallet is not charged')
  const tx = (await gw.api('GET', `/v1/transactions/${r.body.txHash}`)).body
  t.match(tx, { rail: 'card', paymentMethod: 'stripe', status: 'paid' })
  t.equal(await ledgerProtocol(r.body.txHash), 'mpp')

  const both = await merchant({ methods: ['stripe', 'tempo'] })
  const r2 = await pay(a.id, `${both.m.url}/paid`)
  t.match(r2.body, { rail: 'stablecoin', data: { method: 'tempo' } }, 'stablecoin preferred when offered, whatever the order')
})

t.test('a card provider failure fails the payment before the merchant sees anything; the reservation is released', async (t) => {
  const { m } = await merchant({ methods: ['stripe'] })
  const a = await agent({ dailyBudget: { usdc: 1 } })
  card.failNext = 1
  const r = await pay(a.id, `${m.url}/paid`)
  t.equal(r.status, 502)
  t.match(r.body, { error: 'payment_failed', detail: /card provider refused the charge \(HTTP 500\)/ })
  t.equal(m.stats.paymentPosts, 0)
  const list = (await gw.api('GET', `/v1/transactions?agentId=${a.id}`)).body.transactions
  t.match(list, [{ status: 'failed', rail: 'card' }])
  t.same((await gw.gw.policies.usageOf(a.id)).holds ?? [], [], 'nothing held')
  const again = await pay(a.id, `${m.url}/paid`)
  t.equal(again.status, 200, 'the next call pays')
})

t.test('a paymentEndpoint on another origin is not paid unless its host is allowed', async (t) => {
  const a = await agent()
  const other = await merchant()
  const { m } = await merchant({
    rawBody: {
      protocol: 'mpp/1.0',
      amount: { value: '0.01', currency: 'USD' },
      paymentMethods: ['tempo'],
      sessionSupported: true,
      paymentEndpoint: `http://localhost:${new URL(other.m.url).port}/mpp/pay`,
    },
  })
  const r = await pay(a.id, `${m.url}/paid`)
  t.equal(r.status, 402)
  t.equal(r.body.error, 'no_payable_offer')
  t.match(r.body.detail, /paymentEndpoint http:\/\/localhost:\d+ is on another origin/)
  t.equal(other.m.stats.paymentPosts + m.stats.paymentPosts, 0)
})

t.test('nothing payable: no_payable_offer, nothing spent', async (t) => {
  const a = await agent()
  const unknown = await merchant({ methods: ['bitcoin-onchain'] })
  const r = await pay(a.id, `${unknown.m.url}/paid`)
  t.equal(r.status, 402)
  t.equal(r.body.error, 'no_payable_offer')
  t.match(r.body.detail, /unknown methods: bitcoin-onchain/)
  const otherChain = await merchant({ methods: ['tempo'], network: 'eip155:1' })
  const r2 = await pay(a.id, `${otherChain.m.url}/paid`)
  t.equal(r2.body.error, 'no_payable_offer')
  t.match(r2.body.detail, /network eip155:1/)
  t.equal(unknown.m.stats.paymentPosts + otherChain.m.stats.paymentPosts, 0)
})

t.test('payment_protocol_error: a malformed mpp/1.0 body, an unsupported currency; a configured rate converts exactly', async (t) => {
  const a = await agent()
  const bad = await merchant({ rawBody: { protocol: 'mpp/1.0', amount: 5, paymentMethods: ['tempo'], sessionSupported: true, paymentEndpoint: '/mpp/pay' } })
  const r = await pay(a.id, `${bad.m.url}/paid`)
  t.equal(r.status, 502)
  t.equal(r.body.error, 'payment_protocol_error')
  t.match(r.body.detail, /amount must be an object/)
  const yen = await merchant({ currency: 'JPY' })
  const r2 = await pay(a.id, `${yen.m.url}/paid`)
  t.equal(r2.body.error, 'payment_protocol_error')
  t.match(r2.body.detail, /currency "JPY" is not supported/)
  const tooFine = await merchant({ price: '0.0000001' })
  t.match((await pay(a.id, `${tooFine.m.url}/paid`)).body, { error: 'payment_protocol_error', detail: /more than 6 decimal places/ })

  const euro = await merchant({ currency: 'EUR', price: '0.02', payTo: null, expectUnits: 30_000n })
  const r3 = await pay(a.id, `${euro.m.url}/paid`)
  t.equal(r3.status, 200, r3.text)
  t.same(r3.body.amountPaid, { usdc: 0.03 }, '0.02 EUR at 1.5 USDC/EUR')
})

t.test('policy applies to MPP like x402: per-call cap rejects before anything is sent', async (t) => {
  const a = await agent({ perCallLimit: { usdc: 0.005 } })
  const { m } = await merchant()
  const r = await pay(a.id, `${m.url}/paid`)
  t.equal(r.status, 402)
  t.match(r.body, { error: 'policy_violation', reason: 'per_call_limit_exceeded' })
  t.equal(m.stats.paymentPosts, 0)
})

t.test('session expiry: Paygate stops sending an expired session and buys a new one', async (t) => {
  const { m } = await merchant({ sessionHeaderTtl: 60 })
  const a = await agent()
  t.equal((await pay(a.id, `${m.url}/paid`)).body.amountPaid.usdc, 0.01)
  t.equal((await pay(a.id, `${m.url}/paid`)).body.session, 'reused')
  // The clock only moves forward here: other tests share this gateway.
  clock.offset += 61_000
  const r = await pay(a.id, `${m.url}/paid`)
  t.equal(r.body.amountPaid.usdc, 0.01, 'refreshed: paid again')
  t.equal(m.stats.payments, 2)
  t.equal(m.stats.sessionRefusals, 0, 'the expired session was not sent')
  t.equal((await pay(a.id, `${m.url}/paid`)).body.session, 'reused', 'the new session is used')

  const ttl = await merchant({ sessionTtlSeconds: 7200 })
  t.equal((await pay(a.id, `${ttl.m.url}/paid`)).body.amountPaid.usdc, 0.01)
  clock.offset += 3_700_000
  t.equal((await pay(a.id, `${ttl.m.url}/paid`)).body.session, 'reused', "the offer's sessionTtlSeconds beats the 1 h default")
  t.equal(ttl.m.stats.payments, 1)
})

for (const refusal of [402, 401] as const) {
  t.test(`a refused session (${refusal}) is dropped and renegotiated once`, async (t) => {
    const { m } = await merchant({ refuseSessionWith: refusal })
    const a = await agent()
    await pay(a.id, `${m.url}/paid`)
    m.revokeSessions()
    const r = await pay(a.id, `${m.url}/paid`)
    t.equal(r.status, 200, r.text)
    t.equal(r.body.amountPaid.usdc, 0.01, 'one new payment')
    t.equal(m.stats.sessionRefusals, 1)
    t.equal(m.stats.payments, 2)
    t.equal((await pay(a.id, `${m.url}/paid`)).body.session, 'reused')
    t.equal(m.stats.payments, 2)
  })
}

t.test('20 concurrent first calls negotiate one session: one payment', async (t) => {
  const { m, payTo } = await merchant()
  const a = await agent()
  const results = await Promise.all(Array.from({ length: 20 }, () => pay(a.id, `${m.url}/paid`)))
  t.ok(
    results.every((r) => r.status === 200),
    'all served',
  )
  t.equal(results.filter((r) => r.body.amountPaid.usdc === 0.01).length, 1, 'one paid')
  t.equal(results.filter((r) => r.body.session === 'reused').length, 19, 'the others rode on its session')
  t.equal(m.stats.payments, 1)
  t.equal(m.stats.settlements, 1)
  t.equal(await balanceOf(payTo), 10_000n)
})

t.test('a POST is replayed with its body under the new session', async (t) => {
  const { m } = await merchant()
  const a = await agent()
  const body = { query: 'weather', n: 3, nested: { ok: true } }
  const r = await pay(a.id, `${m.url}/paid`, { method: 'POST', body })
  t.equal(r.status, 200, r.text)
  t.equal(r.body.amountPaid.usdc, 0.01)
  t.same(r.body.data, body, 'the target saw the body and echoed it')
  t.same(
    m.stats.postedBodies.map((b) => JSON.parse(b)),
    [body],
  )
})

t.test('a transient failure at the payment endpoint resends the same authorization: one settlement', async (t) => {
  const { m, payTo } = await merchant({ failPaymentsFirst: 1 })
  const a = await agent()
  const r = await pay(a.id, `${m.url}/paid`)
  t.equal(r.status, 200, r.text)
  t.equal(m.stats.paymentPosts, 2)
  t.equal(m.stats.settlements, 1)
  t.equal(await balanceOf(payTo), 10_000n)
  const tx = (await gw.api('GET', `/v1/transactions/${r.body.txHash}`)).body
  t.equal(tx.status, 'paid')
})

t.test('protocol preference against a merchant offering x402 v2 and mpp/1.0 in one 402', async (t) => {
  const cases = [
    { pref: 'auto', want: 'x402' },
    { pref: 'x402', want: 'x402' },
    { pref: 'mpp', want: 'mpp' },
  ] as const
  for (const c of cases) {
    const { m } = await merchant({ x402: true })
    const a = await agent({ protocolPreference: c.pref })
    const r = await pay(a.id, `${m.url}/paid`)
    t.equal(r.status, 200, r.text)
    t.equal(r.body.protocol, c.want, `${c.pref} -> ${c.want}`)
    t.equal(c.want === 'x402' ? m.stats.x402Payments : m.stats.payments, 1)
    t.equal(c.want === 'x402' ? m.stats.payments : m.stats.x402Payments, 0)
  }
  // Fallback: the preferred protocol is not payable here, the other is.
  const mppOnlyCard = await merchant({ x402: true, methods: ['lightning'] })
  const prefersMpp = await agent({ protocolPreference: 'mpp' })
  const r = await pay(prefersMpp.id, `${mppOnlyCard.m.url}/paid`)
  t.equal(r.body.protocol, 'x402', 'mpp preferred but not payable (no lightning rail): x402')
  const mppOnly = await merchant({ x402: false })
  const prefersX402 = await agent({ protocolPreference: 'x402' })
  t.equal((await pay(prefersX402.id, `${mppOnly.m.url}/paid`)).body.protocol, 'mpp', 'x402 preferred but not offered: mpp')
})

t.test('the proxy path: an unmodified client pays over MPP, then rides the session', async (t) => {
  const { m } = await merchant()
  const a = await agent()
  const proxy = new ProxyAgent({ uri: gw.gw.proxyUrl, token: `Basic ${Buffer.from(`${a.id}:${a.key}`).toString('base64')}` })
  t.teardown(() => proxy.close())
  const r1 = await request(`${m.url}/paid`, { dispatcher: proxy })
  t.equal(r1.statusCode, 200)
  t.same(await r1.body.json(), { ok: true, paid: 'mpp', method: 'tempo' })
  t.equal(r1.headers['x-paygate-protocol'], 'mpp')
  t.equal(r1.headers['x-paygate-amount'], '0.01')
  t.match(r1.headers['x-paygate-tx'], /^0x[0-9a-f]{64}$/)
  const r2 = await request(`${m.url}/paid`, { dispatcher: proxy })
  t.equal(r2.statusCode, 200)
  t.same(await r2.body.json(), { ok: true, paid: 'mpp' })
  t.equal(r2.headers['x-paygate-session'], 'reused')
  t.equal(r2.headers['x-paygate-tx'], undefined, 'no payment')
  const r3 = await request(`${m.url}/paid`, { dispatcher: proxy, method: 'POST', body: 'raw bytes \u00e9', headers: { 'content-type': 'text/plain' } })
  t.equal(await r3.body.text(), 'raw bytes \u00e9')
  t.equal(m.stats.payments, 1)
})

t.test('a custom rail (here Lightning) plugs in through the Rail interface', async (t) => {
  const preimages = new Set<string>()
  const charges: RailCharge[] = []
  const lightning: Rail = {
    name: 'lightning',
    async authorize(charge) {
      charges.push(charge)
      const preimage = `pre_${charge.txId}`
      preimages.add(preimage)
      return { authorization: { type: 'lightning', preimage } }
    },
  }
  const gw2 = await startTestGateway({ options: { rails: [lightning] } })
  t.teardown(() => gw2.close())
  const info2 = (await gw2.api('GET', '/v1/chain')).body
  await gw2.api('POST', '/v1/agents', { body: { agentId: 'ln' } })
  await gw2.api('POST', '/v1/wallets', { body: { agentId: 'ln' } })
  const m = await startMppMerchant({
    chain: { rpcUrl: info2.rpcUrl, chainId: info2.chainId, token: info2.token },
    facilitatorKey: generatePrivateKey(),
    payTo: null,
    price: '0.02',
    methods: ['lightning'],
    lightning: (p) => preimages.has(p),
  })
  merchants.push(m)
  const r = await gw2.api('POST', '/v1/pay', { body: { agentId: 'ln', endpoint: `${m.url}/paid` } })
  t.equal(r.status, 200, r.text)
  t.match(r.body, { protocol: 'mpp', rail: 'lightning', amountPaid: { usdc: 0.02 } })
  t.match(charges, [{ agentId: 'ln', method: 'lightning', value: '0.02', currency: 'USD', amount: 20_000n, merchant: m.url }])
  t.equal(m.stats.payments, 1)
})

t.test('the card provider key is never logged', async (t) => {
  t.notOk(gw.logs.some((l) => l.includes('card-secret-key')))
})
