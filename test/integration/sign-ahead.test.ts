import t, { type Test } from 'tap'
import { createServer, request as httpRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import { recoverTypedDataAddress, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { FastSigner } from '../../src/crypto/secp256k1.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { reportedSettlement, startV2Merchant, type Merchant } from '../helpers/merchants.js'

/**
 * A lone payment's authorization is signed while its 402 is on the wire when the agent's last
 * two payments to the same URL were under the same offer (AheadSigner); used only for that
 * offer, after the policy allows it.
 */
const gw = await startTestGateway({ env: { PAYGATE_CHAIN_CHAIN_ID: '84532' } })
t.teardown(() => gw.close())
const { info, balanceOf, merchantOptions } = await testChain(gw)
const PRICE = 10_000n

/** The official @x402/express merchant at PRICE, closed after the test. */
async function v2Merchant(t: Test): Promise<{ m: Merchant; payTo: Hex }> {
  const opts = await merchantOptions(PRICE)
  const m = await startV2Merchant(opts)
  t.teardown(() => m.close())
  return { m, payTo: opts.payTo }
}

const engine = gw.gw.engine as unknown as { aheadSigner: { take(...a: unknown[]): unknown } }
/** What the engine's look-ups for a signature made ahead returned, in order: true when one was used. */
function watchTakes(t: Test): boolean[] {
  const take = engine.aheadSigner.take.bind(engine.aheadSigner)
  const seen: boolean[] = []
  engine.aheadSigner.take = (...a: unknown[]) => {
    const got = take(...a)
    seen.push(got !== null)
    return got
  }
  t.teardown(() => {
    engine.aheadSigner.take = take
  })
  return seen
}
/** Signatures made with agent wallets (EIP-3009 digests) while `fn` runs. */
async function signaturesDuring(fn: () => Promise<unknown>): Promise<number> {
  const orig = FastSigner.prototype.signDigest65
  let n = 0
  FastSigner.prototype.signDigest65 = function (this: FastSigner, d: Hex) {
    n++
    return orig.call(this, d)
  }
  try {
    await fn()
  } finally {
    FastSigner.prototype.signDigest65 = orig
  }
  return n
}
async function agent(id: string): Promise<Hex> {
  await gw.api('POST', '/v1/agents', { body: { agentId: id } })
  return (await gw.api('POST', '/v1/wallets', { body: { agentId: id } })).body.address as Hex
}
const pay = (agentId: string, endpoint: string) => gw.api('POST', '/v1/pay', { body: { agentId, endpoint, method: 'GET' } })

t.test('the official v2 merchant: the third payment to a URL uses the authorization signed ahead, and the merchant settles it on chain', async (t) => {
  const { m, payTo } = await v2Merchant(t)
  const wallet = await agent('ahead1')
  const before = await balanceOf(wallet)
  const takes = watchTakes(t)
  for (let i = 0; i < 2; i++) t.equal((await pay('ahead1', `${m.url}/paid`)).status, 200)
  let third: Awaited<ReturnType<typeof pay>> | undefined
  // Signed once: ahead, not again on the paid path.
  t.equal(await signaturesDuring(async () => (third = await pay('ahead1', `${m.url}/paid`))), 1, 'one signature for the third payment')
  t.equal(third!.status, 200, third!.text)
  t.same(takes, [false, false, true], 'the first two set the plan; the third used the signature made ahead')
  t.equal(m.stats.settlements, 3, 'the merchant settled all three')
  t.equal(await balanceOf(wallet), before - 3n * PRICE, 'all moved on chain')
  t.equal(await balanceOf(payTo), 3n * PRICE)
  const tx = (await gw.api('GET', `/v1/transactions/${third!.body.transactionId}`)).body
  t.match(tx, { status: 'paid', amountPaid: { usdc: 0.01 } })
})

t.test('the policy is asked before anything is signed ahead: a payment it refuses is never signed', async (t) => {
  const { m } = await v2Merchant(t)
  await agent('ahead2')
  for (let i = 0; i < 2; i++) t.equal((await pay('ahead2', `${m.url}/paid`)).status, 200)
  t.equal((await gw.api('PUT', '/v1/policies/ahead2', { body: { perCallLimit: { usdc: 0.005 } } })).status, 200)
  let refused: Awaited<ReturnType<typeof pay>> | undefined
  t.equal(await signaturesDuring(async () => (refused = await pay('ahead2', `${m.url}/paid`))), 0, 'no signature, ahead or not')
  t.equal(refused!.status, 402)
  t.match(refused!.body, { error: 'policy_violation', reason: 'per_call_limit_exceeded' })
  t.equal(m.stats.settlements, 2)
})

type Sent = { authorization: Record<string, string>; signature: Hex }
/**
 * A minimal x402 v2 target: 402 with PAYMENT-REQUIRED at `offer.price` (its resource described by
 * `offer.description`), 200 to any PAYMENT-SIGNATURE, which it keeps (decoded) in `sent`.
 */
async function v2Target(t: Test, offer: { price: bigint; description: string }): Promise<{ url: string; sent: Sent[] }> {
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const sent: Sent[] = []
  const server = createServer((req, res) => {
    const sig = req.headers['payment-signature']
    if (typeof sig === 'string') {
      sent.push((JSON.parse(Buffer.from(sig, 'base64').toString()) as { payload: Sent }).payload)
      res.writeHead(200, { 'content-type': 'application/json', 'payment-response': reportedSettlement(info.chainId) }).end('{"ok":true}')
      return
    }
    const { port } = server.address() as AddressInfo
    const accepts = [{ scheme: 'exact', network: `eip155:${info.chainId}`, amount: String(offer.price), asset: info.token, payTo, maxTimeoutSeconds: 60, extra: { name: 'USD Coin', version: '2' } }]
    const required = Buffer.from(JSON.stringify({ x402Version: 2, error: 'payment required', resource: { url: `http://127.0.0.1:${port}/paid`, description: offer.description }, accepts })).toString(
      'base64',
    )
    res.writeHead(402, { 'payment-required': required, 'content-type': 'application/json' }).end('{}')
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => server.close(() => r())))
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/paid`, sent }
}

t.test('a 402 with another offer (the price changed) drops the signature made ahead: the payment is signed for the new offer', async (t) => {
  const offer = { price: 1000n, description: 'priced' }
  const { url, sent } = await v2Target(t, offer)
  const wallet = await agent('ahead3')
  const takes = watchTakes(t)
  for (let i = 0; i < 2; i++) t.equal((await pay('ahead3', url)).status, 200)
  offer.price = 2500n
  let third: Awaited<ReturnType<typeof pay>> | undefined
  t.equal(await signaturesDuring(async () => (third = await pay('ahead3', url))), 2, 'signed ahead for the old offer, then for the new one')
  t.equal(third!.status, 200, third!.text)
  t.same(takes, [false, false, false], 'the signature made ahead was not used')
  t.same(third!.body.amountPaid, { usdc: 0.0025 })
  const auth = sent[2]!.authorization
  t.equal(auth.value, '2500', 'the authorization sent is for the new price')
  const signer = await recoverTypedDataAddress({
    domain: { name: 'USD Coin', version: '2', chainId: info.chainId, verifyingContract: info.token },
    types: {
      TransferWithAuthorization: [
        { name: 'from', type: 'address' },
        { name: 'to', type: 'address' },
        { name: 'value', type: 'uint256' },
        { name: 'validAfter', type: 'uint256' },
        { name: 'validBefore', type: 'uint256' },
        { name: 'nonce', type: 'bytes32' },
      ],
    },
    primaryType: 'TransferWithAuthorization',
    message: { from: auth.from as Hex, to: auth.to as Hex, value: BigInt(auth.value!), validAfter: BigInt(auth.validAfter!), validBefore: BigInt(auth.validBefore!), nonce: auth.nonce as Hex },
    signature: sent[2]!.signature,
  })
  t.equal(signer.toLowerCase(), wallet.toLowerCase(), 'signed by the agent wallet')
  t.not(sent[2]!.authorization.nonce, sent[1]!.authorization.nonce)
})

t.test('a target whose offers are too long to be kept (a 402 text over 8 KiB) is never signed for ahead: one signature per payment', async (t) => {
  const { url } = await v2Target(t, { price: 1000n, description: 'x'.repeat(9000) })
  await agent('ahead5')
  const takes = watchTakes(t)
  for (let i = 0; i < 3; i++) {
    let r: Awaited<ReturnType<typeof pay>> | undefined
    t.equal(await signaturesDuring(async () => (r = await pay('ahead5', url))), 1, `payment ${i + 1}: signed once`)
    t.equal(r!.status, 200, r!.text)
  }
  t.same(takes, [false, false, false])
})

t.test('through the proxy (absolute-form HTTP): the third payment to a URL uses the authorization signed ahead', async (t) => {
  const { m, payTo } = await v2Merchant(t)
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'ahead4' } })).body.apiKey as string
  await gw.api('POST', '/v1/wallets', { body: { agentId: 'ahead4' } })
  const proxy = new URL(gw.gw.proxyUrl)
  const viaProxy = (url: string): Promise<number> =>
    new Promise((resolve, reject) => {
      const req = httpRequest({ host: proxy.hostname, port: proxy.port, path: url, headers: { 'proxy-authorization': `Basic ${Buffer.from(`ahead4:${key}`).toString('base64')}` } }, (res) => {
        res.resume()
        res.on('end', () => resolve(res.statusCode ?? 0))
      })
      req.on('error', reject)
      req.end()
    })
  const takes = watchTakes(t)
  for (let i = 0; i < 3; i++) t.equal(await viaProxy(`${m.url}/paid`), 200)
  t.same(takes, [false, false, true], 'the third payment used the signature made ahead')
  t.equal(m.stats.settlements, 3, 'the merchant settled all three')
  t.equal(await balanceOf(payTo), 3n * PRICE)
})
