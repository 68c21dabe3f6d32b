import t from 'tap'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { Challenge, Errors } from 'mppx'
import { Mppx, evm } from 'mppx/server'
import { getAddress, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { clientsFor, listen, POLL_MS, RECEIPT_TIMEOUT_MS, serialSend } from '../helpers/merchants.js'
import { startMppMerchant } from '../helpers/mpp-merchant.js'

/**
 * MPP answers that must not read as a payment: a credential refused with a 400 problem, a
 * challenge the target repeats after it was paid, a refused session renegotiated by many
 * calls at once, and an mpp/1.0 offer that cannot carry a POST to the target.
 */
const gw = await startTestGateway({ env: { PAYGATE_PAY_TIMEOUT_MS: '5000' } })
t.teardown(() => gw.close())
const { info, balanceOf, fundedKey } = await testChain(gw)
const chain = { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token }

let n = 0
async function agent(policy?: object): Promise<{ id: string; wallet: Hex }> {
  const id = `m${++n}`
  await gw.api('POST', '/v1/agents', { body: { agentId: id } })
  const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: id } })).body.address as Hex
  if (policy) await gw.api('PUT', `/v1/policies/${id}`, { body: policy })
  return { id, wallet }
}
/** A 402 with one evm/charge challenge of 0.01 USDC (the same challenge id for the same realm, expiry and recipient). */
function challenge(res: ServerResponse, realm: string, expires: string, recipient: Hex): void {
  const c = Challenge.from({
    secretKey: 'x'.repeat(40),
    realm,
    method: 'evm',
    intent: 'charge',
    expires,
    request: { amount: '10000', currency: info.token, recipient, methodDetails: { chainId: info.chainId, credentialTypes: ['authorization'] } },
  } as never)
  res.writeHead(402, { 'www-authenticate': Challenge.serialize(c), 'content-type': 'application/problem+json' })
  res.end(JSON.stringify({ type: 'https://paymentauth.org/problems/payment-required', status: 402 }))
}
const pay = (agentId: string, endpoint: string, extra: object = {}) => gw.api('POST', '/v1/pay', { body: { agentId, endpoint, method: 'GET', ...extra } })
const txsOf = async (agentId: string) => (await gw.api('GET', `/v1/transactions?agentId=${agentId}`)).body.transactions as { status: string; txHash: string | null }[]

t.test('a credential refused with a 400 problem is not a payment; payment-insufficient is payment_failed; the agent keeps its Accept-Payment', async (t) => {
  const recipient = privateKeyToAccount(generatePrivateKey()).address
  const acceptSeen: (string | undefined)[] = []
  const l = await listen((req: IncomingMessage, res) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname
    acceptSeen.push(req.headers['accept-payment'] as string | undefined)
    if (req.headers.authorization?.startsWith('Payment ')) {
      const [status, type] = path === '/bad400' ? [400, 'method-unsupported'] : [402, 'payment-insufficient']
      res.writeHead(status, { 'content-type': 'application/problem+json' })
      res.end(JSON.stringify({ type: `https://paymentauth.org/problems/${type}`, title: type, status, detail: `refused: ${type}` }))
      return
    }
    challenge(res, 'raw.test', new Date(Date.now() + 300_000).toISOString(), recipient)
  })
  t.teardown(() => l.close())
  const a = await agent({ protocolPreference: 'mpp' })
  const before = await balanceOf(a.wallet)

  const r = await pay(a.id, `${l.url}/bad400`, { headers: { 'accept-payment': 'evm/charge, tempo/charge;q=0.1' } })
  t.same([r.status, r.body.error], [402, 'no_payable_offer'], r.text)
  t.match(r.body.detail, /method-unsupported/)
  t.same(acceptSeen, ['evm/charge, tempo/charge;q=0.1', 'evm/charge, tempo/charge;q=0.1'], "the agent's own Accept-Payment on both requests")
  const [tx] = await txsOf(a.id)
  t.match(tx, { status: 'unknown', txHash: null }, 'not paid; held, since the target could still redeem the authorization it refused until it expires')

  const i = await pay(a.id, `${l.url}/insufficient`)
  t.same([i.status, i.body.error], [502, 'payment_failed'], 'the target found the amount short: not insufficient_funds, which is about the wallet')
  t.equal(await balanceOf(a.wallet), before, 'no money moved')
  t.equal((await gw.api('GET', `/v1/policies/${a.id}`)).body.dailyBudget, undefined)
})

t.test('an mppx route that repeats its challenge (fixed expires): paid once; the repeat is no_payable_offer, never a second record', async (t) => {
  const recipient = privateKeyToAccount(generatePrivateKey()).address
  const token = getAddress(info.token)
  const { account, publicClient, walletClient } = clientsFor(chain, await fundedKey())
  const settlements: Hex[] = []
  const settle = async ({ payload }: { payload: { from: Hex; to: Hex; value: string; validAfter: string; validBefore: string; nonce: Hex; signature: Hex } }) => {
    const args = [payload.from, payload.to, BigInt(payload.value), BigInt(payload.validAfter), BigInt(payload.validBefore), payload.nonce, payload.signature] as const
    return serialSend(info.rpcUrl, account.address, async () => {
      try {
        const { request } = await publicClient.simulateContract({ account, address: token, abi: paygateUsdcAbi, functionName: 'transferWithAuthorization', args })
        const hash = await walletClient.writeContract(request)
        await publicClient.waitForTransactionReceipt({ hash, timeout: RECEIPT_TIMEOUT_MS, pollingInterval: POLL_MS })
        settlements.push(hash)
        return { reference: hash }
      } catch (e) {
        throw new Errors.VerificationFailedError({ reason: `settlement rejected: ${(e as Error).message.split('\n')[0]}` })
      }
    })
  }
  const mppx = Mppx.create({
    secretKey: 'refusals-secret-key-0123456789-abcdefgh',
    realm: 'fixed.test',
    methods: [evm.charge({ currency: token, chainId: info.chainId, decimals: 6, authorization: { name: 'USD Coin', version: '2' }, recipient, settle: settle as never })],
  })
  const route = mppx['evm/charge']({ amount: '0.01', expires: new Date(Date.now() + 3_600_000).toISOString() })
  const l = await listen(async (req, res) => {
    const r = await Mppx.toNodeListener(route)(req, res)
    if (r.status === 402) return
    res.setHeader('content-type', 'application/json')
    res.end('{"ok":true}')
  })
  t.teardown(() => l.close())
  const a = await agent({ protocolPreference: 'mpp' })
  const before = await balanceOf(a.wallet)

  const first = await pay(a.id, `${l.url}/fixed`)
  t.equal(first.status, 200, first.text)
  t.match(first.body, { protocol: 'mpp', amountPaid: { usdc: 0.01 }, txHash: /^0x/ })
  const [second, third] = await Promise.all([pay(a.id, `${l.url}/fixed`), pay(a.id, `${l.url}/fixed`)])
  for (const r of [second, third]) {
    t.same([r.status, r.body.error], [402, 'no_payable_offer'], r.text)
    t.match(r.body.detail, /paid before/)
  }
  t.equal(settlements.length, 1, 'one settlement')
  t.equal(before - (await balanceOf(a.wallet)), 10_000n, 'paid once')
  t.same(
    (await txsOf(a.id)).map((x) => x.status),
    ['paid'],
    'one record, paid',
  )
})

t.test('a refused session renegotiated by 20 calls at once: one new payment', async (t) => {
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const m = await startMppMerchant({ chain, facilitatorKey: await fundedKey(), payTo, price: '0.01', methods: ['tempo'], refuseSessionWith: 402 })
  t.teardown(() => m.close())
  const a = await agent()
  const first = await pay(a.id, `${m.url}/paid`)
  t.equal(first.status, 200, first.text)
  t.equal(m.stats.payments, 1)
  m.revokeSessions()
  const rs = await Promise.all(Array.from({ length: 20 }, () => pay(a.id, `${m.url}/paid`)))
  t.same([...new Set(rs.map((r) => r.status))], [200])
  t.equal(rs.filter((r) => r.body.amountPaid.usdc > 0).length, 1, 'one call paid')
  t.equal(rs.filter((r) => r.body.session === 'reused').length, 19, 'the others rode on its session')
  t.equal(m.stats.payments, 2, 'the merchant was paid once more')
})

t.test('an mpp/1.0 offer selling no session cannot carry a POST to the target: no_payable_offer, nothing paid', async (t) => {
  const seen: string[] = []
  let paymentPosts = 0
  const l = await listen(async (req, res) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname
    const chunks: Buffer[] = []
    for await (const c of req) chunks.push(c as Buffer)
    if (path === '/mpp/pay') {
      paymentPosts++
      res.writeHead(200, { 'content-type': 'application/json' })
      return res.end('{"from":"payment endpoint"}')
    }
    seen.push(`${req.method} ${Buffer.concat(chunks).toString()}`)
    res.writeHead(402, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ protocol: 'mpp/1.0', amount: { value: '0.01', currency: 'USD' }, paymentMethods: ['stablecoin'], sessionSupported: false, paymentEndpoint: '/mpp/pay' }))
  })
  t.teardown(() => l.close())
  const a = await agent()
  const r = await pay(a.id, `${l.url}/thing`, { method: 'POST', body: { q: 'important' } })
  t.same([r.status, r.body.error], [402, 'no_payable_offer'], r.text)
  t.match(r.body.detail, /sells no session/)
  t.equal(paymentPosts, 0, 'nothing paid')
  t.same(seen, ['POST {"q":"important"}'])
  const g = await pay(a.id, `${l.url}/thing`)
  t.equal(g.status, 200, 'a GET is still paid: the payment answer is the resource')
  t.equal(paymentPosts, 1)
})

t.test('a repeated challenge whose first payment is still open (held, unsettled) is not paid again', async (t) => {
  const recipient = privateKeyToAccount(generatePrivateKey()).address
  const expires = new Date(Date.now() + 300_000).toISOString()
  let credentials = 0
  const l = await listen((req: IncomingMessage, res) => {
    if (req.headers.authorization?.startsWith('Payment ')) {
      credentials++
      // Takes the credential, settles nothing, answers 404: the payment stays open until it expires.
      res.writeHead(404, { 'content-type': 'application/json' })
      return res.end('{"error":"gone"}')
    }
    challenge(res, 'held.test', expires, recipient)
  })
  t.teardown(() => l.close())
  const a = await agent({ protocolPreference: 'mpp' })

  const first = await pay(a.id, `${l.url}/thing`)
  t.equal(first.status, 200, first.text)
  t.match(first.body, { protocol: null, amountPaid: { usdc: 0 }, status: 404, transactionId: /^tx_/ }, 'not settled: nothing paid, held')
  const second = await pay(a.id, `${l.url}/thing`)
  t.same([second.status, second.body.error, second.body.transactionId], [402, 'no_payable_offer', first.body.transactionId], second.text)
  t.match(second.body.detail, /held by transaction/)
  t.equal(credentials, 1, 'the challenge was sent once')
  t.same(
    (await txsOf(a.id)).map((x) => x.status),
    ['unknown'],
    'one open transaction: the reconciler can count its transfer once',
  )
})
