import t, { type Test } from 'tap'
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createWalletClient, http, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { serialSend } from '../helpers/merchants.js'

/**
 * A payment whose authorization left Paygate is not released because the target said no:
 * the target (or an honest facilitator that timed out) may still settle it. Targets here
 * refuse the paid retry (402, or a payment endpoint's 4xx), or serve it without reporting a
 * settlement, and settle the authorization themselves a moment later. Every settlement must
 * be recorded and the budget must hold. Also: validity is capped, 0-amount offers are not
 * paid, a dripped 402 body has a deadline, and a parent must be the payer's own.
 */
const gw = await startTestGateway({ env: { PAYGATE_PAY_TIMEOUT_MS: '2000' } })
t.teardown(() => gw.close())
const { info, pub, balanceOf, fundedKey } = await testChain(gw)
const PRICE = 10_000n // 0.01 USDC

let n = 0
async function agent(policy: object = { dailyBudget: { usdc: 0.02 } }): Promise<{ id: string; key: string; wallet: Hex }> {
  const id = `s${++n}`
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: id } })).body.apiKey as string
  const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: id } })).body.address as Hex
  await gw.api('PUT', `/v1/policies/${id}`, { body: policy })
  return { id, key, wallet }
}
const txsOf = async (agentId: string): Promise<{ status: string; txHash: string | null; reason?: string }[]> => (await gw.api('GET', `/v1/transactions?agentId=${agentId}&limit=100`)).body.transactions
const usedToday = async (agentId: string): Promise<number> => (await gw.api('GET', `/v1/policies/${agentId}`)).body.dailyBudget.usedToday

interface Auth {
  from: Hex
  to: Hex
  value: string
  validAfter: string
  validBefore: string
  nonce: Hex
  signature: Hex
}

type Answer = 'refuse' | 'serve-unreported'

/**
 * A target that takes every payment, answers as `answer` says, and settles the authorization
 * itself `settleAfterMs` later from its own funded key (one send at a time). `kind` picks the
 * 402: x402 v2, or mpp/1.0 with a payment endpoint.
 */
async function lateSettler(t: Test, kind: 'x402' | 'mpp', answer: Answer, opts: { settleAfterMs?: number; amount?: string; maxTimeoutSeconds?: number } = {}) {
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const account = privateKeyToAccount(await fundedKey())
  const wallet = createWalletClient({ account, chain: viemChain(info.chainId, info.network, info.rpcUrl), transport: http(info.rpcUrl) })
  const received: Auth[] = []
  const settling: Promise<void>[] = []
  const settle = (a: Auth): void => {
    received.push(a)
    const later = new Promise<void>((r) => setTimeout(r, opts.settleAfterMs ?? 1_500)).then(() =>
      serialSend(info.rpcUrl, account.address, async () => {
        const args = [a.from, a.to, BigInt(a.value), BigInt(a.validAfter), BigInt(a.validBefore), a.nonce, a.signature] as const
        const hash = await wallet.writeContract({ address: info.token, abi: paygateUsdcAbi, functionName: 'transferWithAuthorization', args })
        await pub.waitForTransactionReceipt({ hash })
      }),
    )
    settling.push(later)
  }
  const amount = opts.amount ?? PRICE.toString()
  const srv: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const base = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`
      const sig = req.headers['payment-signature']
      if (kind === 'x402' && typeof sig === 'string') {
        const p = JSON.parse(Buffer.from(sig, 'base64').toString()) as { payload: { authorization: Omit<Auth, 'signature'>; signature: Hex } }
        settle({ ...p.payload.authorization, signature: p.payload.signature })
        return void (answer === 'refuse' ? challenge402(res, base + req.url) : res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}'))
      }
      if (kind === 'mpp' && req.url === '/mpp/pay') {
        const b = JSON.parse(Buffer.concat(chunks).toString()) as { authorization: Auth }
        settle(b.authorization)
        return void (answer === 'refuse'
          ? res.writeHead(409, { 'content-type': 'application/json' }).end('{"error":"declined"}')
          : res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}'))
      }
      if (kind === 'x402') return challenge402(res, base + req.url)
      res.writeHead(402, { 'content-type': 'application/json' })
      res.end(
        JSON.stringify({
          protocol: 'mpp/1.0',
          amount: { value: (Number(amount) / 1e6).toFixed(6), currency: 'USDC' },
          paymentMethods: ['tempo'],
          sessionSupported: false,
          paymentEndpoint: `${base}/mpp/pay`,
          payTo,
          network: `eip155:${info.chainId}`,
          token: info.token,
        }),
      )
    })
  })
  function challenge402(res: ServerResponse, url: string): void {
    const accepts = [
      { scheme: 'exact', network: `eip155:${info.chainId}`, amount, asset: info.token, payTo, maxTimeoutSeconds: opts.maxTimeoutSeconds ?? 60, extra: { name: 'USD Coin', version: '2' } },
    ]
    const required = Buffer.from(JSON.stringify({ x402Version: 2, error: 'payment required', resource: { url }, accepts })).toString('base64')
    res.writeHead(402, { 'payment-required': required, 'content-type': 'application/json' }).end('{}')
  }
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    srv.closeAllConnections()
    return new Promise<void>((r) => srv.close(() => r()))
  })
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, payTo, received, settled: () => Promise.all(settling) }
}

/** A GET through the proxy port in absolute form, as an agent's HTTP_PROXY makes it. */
function viaProxy(url: string, agentId: string, key: string): Promise<{ status: number; error: string | undefined }> {
  const p = new URL(gw.gw.proxyUrl)
  const auth = `Basic ${Buffer.from(`${agentId}:${key}`).toString('base64')}`
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: p.hostname, port: p.port, path: url, headers: { 'proxy-authorization': auth } }, (res) => {
      res.resume()
      res.on('end', () => resolve({ status: res.statusCode ?? 0, error: res.headers['x-paygate-error'] as string | undefined }))
    })
    req.on('error', reject)
    req.end()
  })
}

/** The reconciler's periodic pass, run now (after the target's late settlements landed). */
const reconcile = (): Promise<void> => gw.gw.reconciler.runOnce()

for (const [kind, path] of [
  ['x402', 'REST'],
  ['x402', 'proxy'],
  ['mpp', 'REST'],
] as const) {
  t.test(`${kind} through ${path}: a target that refuses the paid retry and settles later is recorded; the budget holds (2 of 20)`, async (t) => {
    const target = await lateSettler(t, kind, 'refuse')
    const a = await agent(kind === 'mpp' ? { dailyBudget: { usdc: 0.02 }, protocolPreference: 'mpp' } : undefined)
    const before = await balanceOf(a.wallet)
    const errors: string[] = []
    for (let i = 0; i < 20; i++) {
      if (path === 'REST') {
        const r = await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${target.url}/data?i=${i}` } })
        errors.push(r.body.reason ?? r.body.error)
      } else {
        const r = await viaProxy(`${target.url}/data?i=${i}`, a.id, a.key)
        errors.push(r.error ?? String(r.status))
      }
    }
    t.equal(target.received.length, 2, 'only two authorizations ever left Paygate')
    t.same(errors.slice(0, 2), ['payment_failed', 'payment_failed'], 'the refusals are payment_failed')
    t.equal(errors.slice(2).filter((e) => e === (path === 'REST' ? 'daily_budget_exceeded' : 'policy_violation')).length, 18, 'the rest refused by the budget the refused payments still hold')
    t.same((await txsOf(a.id)).filter((x) => x.status === 'unknown').length, 2, 'held, not failed')

    await target.settled()
    await reconcile()
    const paid = (await txsOf(a.id)).filter((x) => x.status === 'paid')
    t.equal(paid.length, 2, 'both late settlements recorded as paid')
    t.ok(
      paid.every((x) => /^0x[0-9a-f]{64}$/.test(x.txHash ?? '')),
      'with their ledger records',
    )
    t.equal(await usedToday(a.id), 0.02, 'and counted in the budget')
    t.equal(await balanceOf(a.wallet), before - 2n * PRICE, 'exactly what moved on chain')
    t.equal(await balanceOf(target.payTo), 2n * PRICE)
  })
}

t.test('a 2xx with no settlement reported and none on chain is held, then recorded when the target settles', async (t) => {
  const target = await lateSettler(t, 'x402', 'serve-unreported')
  const a = await agent()
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${target.url}/data` } })
  t.equal(r.status, 200, r.text)
  t.match(r.body, { protocol: null, txHash: null, status: 200, data: { ok: true }, transactionId: /^tx_/ }, "the target's answer; no payment claimed yet")
  t.match(await txsOf(a.id), [{ status: 'unknown' }], 'held')
  await target.settled()
  await reconcile()
  t.match(await txsOf(a.id), [{ status: 'paid', txHash: /^0x/ }], 'recorded once the chain shows it')
  t.equal(await usedToday(a.id), 0.01)
})

t.test('an offer with maxTimeoutSeconds 1e12 is signed for at most pay.maxAuthorizationSeconds (300 s)', async (t) => {
  const target = await lateSettler(t, 'x402', 'refuse', { maxTimeoutSeconds: 1e12, settleAfterMs: 0 })
  const a = await agent()
  const nowS = Math.floor(Date.now() / 1000)
  await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${target.url}/data` } })
  t.equal(target.received.length, 1)
  const validBefore = Number(target.received[0]!.validBefore)
  t.ok(validBefore <= nowS + 300 + 5 && validBefore >= nowS + 290, `validBefore ${validBefore - nowS} s from now`)
  await target.settled()
  await reconcile()
})

t.test('an offer of 0 USDC is not paid: no_payable_offer, nothing signed, no record', async (t) => {
  const target = await lateSettler(t, 'x402', 'refuse', { amount: '0' })
  const a = await agent()
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: a.id, endpoint: `${target.url}/data` } })
  t.same([r.status, r.body.error], [402, 'no_payable_offer'], r.text)
  t.match(r.body.detail, /0 USDC/)
  t.equal(target.received.length, 0, 'no authorization sent')
  t.same(await txsOf(a.id), [], 'no transaction, so no ledger record')
})

t.test('a 402 body dripped a byte at a time hits the deadline (pay.timeoutMs for the whole body) instead of hanging', async (t) => {
  const srv = createServer((_req, res) => {
    res.writeHead(402, { 'content-type': 'application/json' })
    const timer = setInterval(() => res.write(' '), 200)
    res.on('close', () => clearInterval(timer))
  })
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    srv.closeAllConnections()
    return new Promise<void>((r) => srv.close(() => r()))
  })
  const a = await agent()
  const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}/drip`
  const res = await fetch(`${gw.url}/v1/pay`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gw.accountKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({ agentId: a.id, endpoint: url }),
    signal: AbortSignal.timeout(15_000),
  })
  const body = (await res.json()) as { error: string; detail: string }
  t.same([res.status, body.error], [502, 'upstream_unreachable'], JSON.stringify(body))
  t.match(body.detail, /did not arrive within 2000 ms/)
})

t.test("parentTxHash must be one of the payer's own transactions", async (t) => {
  const target = await lateSettler(t, 'x402', 'serve-unreported', { settleAfterMs: 0 })
  const owner = await agent()
  const other = await agent()
  const first = await gw.api('POST', '/v1/pay', { body: { agentId: owner.id, endpoint: `${target.url}/a` } })
  await target.settled()
  await reconcile()
  const parent = (await txsOf(owner.id))[0]!
  t.equal(parent.status, 'paid', first.text)
  const foreign = await gw.api('POST', '/v1/pay', { body: { agentId: other.id, endpoint: `${target.url}/b`, parentTxHash: parent.txHash } })
  t.same([foreign.status, foreign.body.error, foreign.body.field], [400, 'invalid_request', 'parentTxHash'], foreign.text)
  t.equal(target.received.length, 1, "nothing paid under another agent's transaction")
  const own = await gw.api('POST', '/v1/pay', { body: { agentId: owner.id, endpoint: `${target.url}/c`, parentTxHash: parent.txHash } })
  t.equal(own.status, 200, own.text)
  await target.settled()
  await reconcile()
  const child = (await gw.api('GET', `/v1/transactions?agentId=${owner.id}&limit=10`)).body.transactions.find((x: { parentTxHash: string | null }) => x.parentTxHash === parent.txHash)
  t.match(child, { status: 'paid', depth: 1 }, 'its own tree grows')
})
