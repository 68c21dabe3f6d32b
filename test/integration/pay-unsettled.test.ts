import t, { type Test } from 'tap'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createWalletClient, http, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import type { PaygateError } from '../../src/errors/index.js'
import { isEip3009, newTxId, type TxRecord } from '../../src/ledger/transactions.js'
import { OffsetClock } from '../../src/util/clock.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { reportedSettlement, startV1Merchant, startV2Merchant, type Merchant } from '../helpers/merchants.js'

/**
 * Payments whose authorization reached the target but did not settle (the route answered
 * 4xx, or the target never answered): nothing is paid, the reservation stays held while the
 * target could still redeem the authorization, and a late settlement is recorded as paid.
 */
const clock = new OffsetClock()
const gw = await startTestGateway({ clock, env: { PAYGATE_CHAIN_CHAIN_ID: '84532', PAYGATE_PAY_TIMEOUT_MS: '800' } })
t.teardown(() => gw.close())
const { info, pub, balanceOf, fundedKey, merchantOptions } = await testChain(gw)
const PRICE = 10_000n

let n = 0
async function agent(policy: object = { dailyBudget: { usdc: 1 } }): Promise<{ id: string; wallet: Hex }> {
  const id = `u${++n}`
  await gw.api('POST', '/v1/agents', { body: { agentId: id } })
  const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: id } })).body.address as Hex
  await gw.api('PUT', `/v1/policies/${id}`, { body: policy })
  return { id, wallet }
}
const onlyTx = async (agentId: string) => {
  const list = (await gw.api('GET', `/v1/transactions?agentId=${agentId}`)).body.transactions
  return list[0]
}
const usedToday = async (agentId: string): Promise<number> => (await gw.api('GET', `/v1/policies/${agentId}`)).body.dailyBudget.usedToday
const heldFor = async (agentId: string) => (await gw.gw.policies.usageOf(agentId)).holds ?? []

/** A merchant's facilitator settling a stored authorization late, as the target still may. */
async function settleLate(transactionId: string): Promise<void> {
  const rec = await gw.gw.transactions.get(transactionId)
  const a = rec!.authorization!
  if (!isEip3009(a)) throw new Error('not an EIP-3009 authorization')
  const wc = createWalletClient({ account: privateKeyToAccount(await fundedKey()), chain: viemChain(info.chainId, info.network, info.rpcUrl), transport: http(info.rpcUrl) })
  const hash = await wc.writeContract({
    address: info.token,
    abi: paygateUsdcAbi,
    functionName: 'transferWithAuthorization',
    args: [a.from as Hex, a.to as Hex, BigInt(a.value), BigInt(a.validAfter), BigInt(a.validBefore), a.nonce as Hex, a.signature as Hex],
  })
  await pub.waitForTransactionReceipt({ hash })
}

for (const kind of ['v2', 'v1'] as const) {
  t.test(`the official ${kind} merchant's route answers 404 after a valid payment: not settled, so not paid; held; a late settlement is recorded`, async (t) => {
    const opts = await merchantOptions(PRICE)
    const m: Merchant = kind === 'v2' ? await startV2Merchant(opts) : await startV1Merchant(opts)
    t.teardown(() => m.close())
    const a = await agent()
    const before = await balanceOf(a.wallet)

    const r = await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${m.url}/paid?status=404`, method: 'GET' } })
    t.equal(r.status, 200, r.text)
    t.match(r.body, { protocol: null, amountPaid: { usdc: 0 }, txHash: null, status: 404, data: { error: 'route answered' } }, "the target's answer, nothing paid")
    t.equal(m.stats.settlements, 0, 'the merchant did not settle')
    t.equal(await balanceOf(a.wallet), before, 'no money moved')
    const tx = await onlyTx(a.id)
    t.match(tx, { status: 'unknown', txHash: null }, 'the outcome is open while the authorization is valid')
    t.equal(await usedToday(a.id), 0, 'no spend committed')
    t.equal((await heldFor(a.id)).length, 1, 'the reservation is held')

    await settleLate(tx.id)
    await gw.gw.reconciler.runOnce()
    const after = (await gw.api('GET', `/v1/transactions/${tx.id}`)).body
    t.match(after, { status: 'paid', txHash: /^0x[0-9a-f]{64}$/ }, 'settled later: recorded as paid')
    t.equal(await usedToday(a.id), 0.01, 'and its spend committed')
    t.same(await heldFor(a.id), [])
  })
}

/** A simple-shape 402 target that takes every paid attempt and never answers it. */
async function silentTarget(t: Test): Promise<{ url: string; attempts: () => number }> {
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  let attempts = 0
  const srv: Server = createServer((req, res) => {
    if (req.headers['x-payment']) {
      attempts++
      return // never answers
    }
    const base = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`
    res
      .writeHead(402, { 'content-type': 'application/json' })
      .end(JSON.stringify({ scheme: 'exact', network: `eip155:${info.chainId}`, token: info.token, amount: '250000', payTo, resource: base + req.url }))
  })
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    srv.closeAllConnections()
    return new Promise<void>((r) => srv.close(() => r()))
  })
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, attempts: () => attempts }
}

t.test('a target that never answers the paid retry: payment_failed, the reservation held until validBefore, a late settlement recorded', async (t) => {
  const target = await silentTarget(t)
  const a = await agent()
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${target.url}/report` } })
  t.same([r.status, r.body.error], [502, 'payment_failed'], r.text)
  t.equal(target.attempts(), 3, 'the same authorization, three attempts')
  const tx = await onlyTx(a.id)
  t.equal(tx.status, 'unknown', 'the target holds a valid authorization: the outcome stays open')
  t.equal((await heldFor(a.id)).length, 1, 'the reservation is held')

  await gw.gw.reconciler.runOnce()
  t.equal((await onlyTx(a.id)).status, 'unknown', 'still open while the authorization is valid and unused')

  await settleLate(tx.id)
  await gw.gw.reconciler.runOnce()
  t.match(await onlyTx(a.id), { status: 'paid', txHash: /^0x/ }, 'the late settlement is recorded')
  t.equal(await usedToday(a.id), 0.25)
})

t.test('a target that never answers and never settles: the reservation is released once the authorization expires', async (t) => {
  const target = await silentTarget(t)
  const a = await agent()
  // Signed an hour in the past, so the chain (which keeps its own time) is already past validBefore.
  clock.offset -= 3_600_000
  t.teardown(() => {
    clock.offset = 0
  })
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${target.url}/report` } })
  t.equal(r.status, 502)
  t.equal((await heldFor(a.id)).length, 1)
  await gw.gw.reconciler.runOnce()
  t.match(await onlyTx(a.id), { status: 'failed', txHash: null })
  t.same(await heldFor(a.id), [], 'released')
})

t.test('a 402 whose body is too large to read for offers: offers in its headers are still paid; without any, it is passed on whole', async (t) => {
  const page = Buffer.alloc(300 * 1024, 'x')
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const srv: Server = createServer((req, res) => {
    const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}${req.url}`
    if (req.headers['payment-signature']) return void res.writeHead(200, { 'content-type': 'application/json', 'payment-response': reportedSettlement(info.chainId) }).end('{"ok":true}')
    const accepts = [{ scheme: 'exact', network: `eip155:${info.chainId}`, amount: '1000', asset: info.token, payTo, maxTimeoutSeconds: 60, extra: { name: 'USD Coin', version: '2' } }]
    const required = Buffer.from(JSON.stringify({ x402Version: 2, resource: { url }, accepts })).toString('base64')
    res.writeHead(402, { 'content-type': 'text/html', ...(req.url === '/header-offer' ? { 'payment-required': required } : {}) })
    res.end(page)
  })
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => srv.close(() => r())))
  const base = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`
  const a = await agent()

  const paid = await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${base}/header-offer` } })
  t.equal(paid.status, 200, paid.text)
  t.match(paid.body, { protocol: 'x402', amountPaid: { usdc: 0.001 }, txHash: /^0x/ })

  const none = await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${base}/no-offer` } })
  t.same([none.status, none.body.error], [502, 'payment_protocol_error'])
  t.match(none.body.detail, /was not read for offers/)

  const out = await gw.gw.engine.pay({ agentId: a.id, url: `${base}/no-offer`, method: 'GET', headers: {}, body: null })
  t.equal(out.response.status, 402)
  let size = 0
  for await (const c of out.response.body) size += (c as Buffer).length
  t.equal(size, page.length, 'the whole body is passed on')
})

t.test('the policy has its say before the wallet: an agent without a wallet gets the policy rejection, recorded', async (t) => {
  const id = 'nowallet'
  await gw.api('POST', '/v1/agents', { body: { agentId: id } })
  await gw.api('PUT', `/v1/policies/${id}`, { body: { blockedDomains: ['127.0.0.1'] } })
  const target = await silentTarget(t)
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: id, endpoint: `${target.url}/x` } })
  t.same([r.status, r.body.error, r.body.reason], [402, 'policy_violation', 'domain_blocked'], r.text)
  const rejected = (await gw.api('GET', `/v1/transactions?agentId=${id}&status=rejected`)).body.transactions
  t.equal(rejected.length, 1)
  await gw.api('PUT', `/v1/policies/${id}`, { body: { blockedDomains: [] } })
  const w = await gw.api('POST', '/v1/pay', { body: { agentId: id, endpoint: `${target.url}/x` } })
  t.same([w.status, w.body.error], [404, 'not_found'], 'allowed by the policy: then the missing wallet is the answer')
})

t.test('a request cut off by a crash: what its transaction says decides the replay', async (t) => {
  const now = Date.now()
  const base = {
    agentId: 'cut',
    createdAt: now,
    updatedAt: now,
    endpoint: 'http://127.0.0.1:1/x',
    method: 'GET',
    protocol: 'x402' as const,
    amount: '1000',
    txHash: null,
    parentTxHash: null,
    depth: 0,
  }
  const eip3009 = (signature: string) => ({
    from: '0x0000000000000000000000000000000000000001',
    to: '0x0000000000000000000000000000000000000002',
    value: '1000',
    validAfter: '0',
    validBefore: '1',
    nonce: `0x${'11'.repeat(32)}`,
    signature,
  })
  const cases: [string, Partial<TxRecord>, 'again' | 'paid' | string][] = [
    ['rejected by the policy', { status: 'rejected' }, 'again'],
    ['short of funds (nothing signed)', { status: 'failed', error: 'insufficient_funds' }, 'again'],
    ['an EIP-3009 authorization that failed unsigned or expired unused', { status: 'failed', authorization: eip3009('') }, 'again'],
    ['an EIP-3009 authorization refused after it was sent', { status: 'failed', authorization: eip3009('0xabc'), attempts: 1 }, 'payment_failed'],
    ['an off-chain proof whose outcome stayed unknown until it expired', { status: 'failed', authorization: { kind: 'card', expiresAt: now, wire: { spt: 'x' } } }, 'payment_failed'],
    ['still settling', { status: 'unknown', authorization: eip3009('') }, 'unavailable'],
    ['paid', { status: 'paid', txHash: `0x${'22'.repeat(32)}` }, 'paid'],
  ]
  let i = 0
  for (const [what, rec, want] of cases) {
    const key = `cut-${++i}`
    await gw.gw.transactions.put({ ...base, id: newTxId(now + i), idempotencyKey: key, ...rec } as TxRecord)
    const got = await gw.gw.engine.cutOff('cut', key, now).then(
      (r) => (r ? r.status : 'again'),
      (e: PaygateError) => e.code,
    )
    t.equal(got, want, what)
  }
  t.equal(await gw.gw.engine.cutOff('cut', 'never-used', now), undefined, 'no transaction: nothing went out')
})
