import t from 'tap'
import { readFileSync } from 'node:fs'
import { hashTypedData, recoverTypedDataAddress, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import {
  X402_V1_NETWORKS,
  authorizationFor,
  choose,
  decodeBase64Json,
  detectX402,
  encodeBase64Json,
  isPayable,
  namesChain,
  parseAmount,
  paymentHeaders,
  readSettlement,
  sameOrigin,
  typedData,
  transferTypedData,
  typedDataDigest,
} from '../../src/protocols/x402.js'
import type { Eip3009Authorization, HttpAnswer, Offer, PayableChain } from '../../src/protocols/types.js'
import { PaygateError } from '../../src/errors/index.js'
import { FastSigner } from '../../src/crypto/secp256k1.js'
import { X402Adapter, eip3009Of, newNonce, signChainTransfer } from '../../src/engine/adapters/x402.js'
import type { PayRequest } from '../../src/engine/adapters/types.js'
import { isEip3009, type StoredAuthorization } from '../../src/ledger/transactions.js'

/**
 * Captured from the official packages (x402 / x402-express / x402-fetch 1.2.0 and
 * @x402/core, @x402/evm, @x402/express, @x402/fetch 2.27.0 with viem 2.56.8) running
 * in-process against local anvil chains; see the fixture's `note`.
 */
interface Official {
  v1: { chainId: number; requestUrl: string; answer402Body: string; officialXPayment: string; xPaymentResponse: string }
  v2: {
    chainId: number
    requestUrl: string
    paymentRequired: string
    answer402Body: string
    officialPaymentSignature: string
    paymentResponse: string
  }
}
const official = JSON.parse(readFileSync(new URL('../fixtures/x402/official.json', import.meta.url), 'utf8')) as Official

const TOKEN = '0x5FbDB2315678afecb367f032d93F642f64180aa3' as const
const PAY_TO = '0x8D7e4F309bB948ACE859CEEa2554a990Fd54B688' as const
const OTHER = '0x036CbD53842c5426634e7929541eC2318f3dCF7e' as const
const DOMAIN = { name: 'USD Coin', version: '2' }

const answer = (body: unknown, headers: HttpAnswer['headers'] = {}): HttpAnswer => ({
  status: 402,
  headers,
  body: Buffer.from(typeof body === 'string' ? body : JSON.stringify(body)),
})

const v1Entry = (over: Record<string, unknown> = {}) => ({
  scheme: 'exact',
  network: 'base-sepolia',
  maxAmountRequired: '10000',
  resource: 'https://shop.test/paid',
  description: 'd',
  mimeType: 'application/json',
  payTo: PAY_TO,
  maxTimeoutSeconds: 120,
  asset: TOKEN,
  extra: { name: 'USD Coin', version: '2' },
  ...over,
})
const v2Entry = (over: Record<string, unknown> = {}) => ({
  scheme: 'exact',
  network: 'eip155:84532',
  amount: '10000',
  asset: TOKEN.toLowerCase(),
  payTo: PAY_TO,
  maxTimeoutSeconds: 120,
  extra: { name: 'USD Coin', version: '2' },
  ...over,
})
const v2Required = (accepts: unknown[], extra: Record<string, unknown> = {}) => ({
  x402Version: 2,
  error: 'Payment required',
  resource: { url: 'https://shop.test/paid', description: 'd', mimeType: 'application/json' },
  accepts,
  ...extra,
})
const chainOf = (chainId: number, token: `0x${string}` = TOKEN, networkName = 'paygate-devnet', tokenDomain = DOMAIN): PayableChain => ({
  chainId,
  networkName,
  token,
  tokenDomain,
})
const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64')
const only = (d: { offers: Offer[] }): Offer => {
  const o = d.offers[0]
  if (!o || d.offers.length !== 1) throw new Error(`expected one offer, got ${d.offers.length}`)
  return o
}

// ---------------------------------------------------------------------------

t.test('official v1 402 body (x402-express 1.2.0)', async (t) => {
  const d = detectX402(answer(official.v1.answer402Body))
  t.equal(d.recognized, true)
  t.same(d.problems, [])
  const o = only(d)
  t.match(o, {
    protocol: 'x402',
    shape: 'x402-v1',
    scheme: 'exact',
    network: 'base-sepolia',
    amount: 10000n,
    resource: `${official.v1.requestUrl}`,
    maxTimeoutSeconds: 120,
    extra: { name: 'USD Coin', version: '2' },
    index: 0,
  })
  t.equal(isPayable(o, { chainId: 84532, networkName: 'x', token: o.asset, tokenDomain: DOMAIN }), true)
  t.equal(isPayable(o, { chainId: 8453, networkName: 'x', token: o.asset, tokenDomain: DOMAIN }), false)
  t.equal(sameOrigin(o, official.v1.requestUrl), true)
})

t.test('official v2 PAYMENT-REQUIRED header (@x402/express 2.27.0)', async (t) => {
  const d = detectX402(answer(official.v2.answer402Body, { 'payment-required': official.v2.paymentRequired }))
  t.equal(d.recognized, true)
  t.same(d.problems, [])
  const o = only(d)
  t.equal(o.shape, 'x402-v2')
  t.equal(o.network, 'eip155:31337')
  t.equal(o.amount, 10000n)
  t.equal(o.resource, official.v2.requestUrl)
  // The official server lower-cases the asset; the offer carries it checksummed, the raw entry untouched.
  t.equal(o.asset, TOKEN)
  t.equal((o.raw as { asset: string }).asset, TOKEN.toLowerCase())
  t.match(o.envelope, { resource: { url: official.v2.requestUrl }, extensions: null })
  t.equal(isPayable(o, chainOf(31337)), true)
})

t.test('our typed data reproduces what the official clients signed', async (t) => {
  // v1: x402-fetch 1.2.0's X-PAYMENT
  const v1Offer = only(detectX402(answer(official.v1.answer402Body)))
  const v1Pay = decodeBase64Json(official.v1.officialXPayment) as {
    payload: { signature: Hex; authorization: Record<string, string> }
  }
  const asAuth = (a: Record<string, string>): Eip3009Authorization => ({
    from: a.from as Hex,
    to: a.to as Hex,
    value: BigInt(a.value ?? ''),
    validAfter: BigInt(a.validAfter ?? ''),
    validBefore: BigInt(a.validBefore ?? ''),
    nonce: a.nonce as Hex,
  })
  const a1 = asAuth(v1Pay.payload.authorization)
  const r1 = await recoverTypedDataAddress({
    ...typedData(v1Offer, a1, official.v1.chainId, { name: 'wrong', version: '9' }),
    signature: v1Pay.payload.signature,
  })
  t.equal(r1, a1.from, 'v1 signature recovers to the payer')

  // v2: @x402/fetch 2.27.0's PAYMENT-SIGNATURE
  const v2Offer = only(detectX402(answer('{}', { 'payment-required': official.v2.paymentRequired })))
  const v2Pay = decodeBase64Json(official.v2.officialPaymentSignature) as {
    payload: { signature: Hex; authorization: Record<string, string> }
  }
  const a2 = asAuth(v2Pay.payload.authorization)
  const r2 = await recoverTypedDataAddress({
    ...typedData(v2Offer, a2, official.v2.chainId, DOMAIN),
    signature: v2Pay.payload.signature,
  })
  t.equal(r2, a2.from, 'v2 signature recovers to the payer')
})

t.test("our headers have the official clients' structure", async (t) => {
  const account = privateKeyToAccount(generatePrivateKey())
  const now = 1_800_000_000

  const v2Offer = only(detectX402(answer('{}', { 'payment-required': official.v2.paymentRequired })))
  const auth2 = authorizationFor(v2Offer, { from: account.address, nonce: generatePrivateKey(), nowSeconds: now })
  const sig2 = await account.signTypedData(typedData(v2Offer, auth2, 31337, DOMAIN))
  const h2 = paymentHeaders(v2Offer, auth2, sig2)
  t.same(Object.keys(h2), ['payment-signature'])
  const ours2 = decodeBase64Json(h2['payment-signature'] ?? '') as Record<string, unknown>
  const theirs2 = decodeBase64Json(official.v2.officialPaymentSignature) as Record<string, unknown>
  t.same(Object.keys(ours2), Object.keys(theirs2))
  t.same(ours2.accepted, theirs2.accepted, 'accepted is the raw entry, byte for byte')
  t.same(ours2.resource, theirs2.resource)
  t.same(Object.keys(ours2.payload as object), Object.keys(theirs2.payload as object))
  t.same(Object.keys((ours2.payload as { authorization: object }).authorization), Object.keys((theirs2.payload as { authorization: object }).authorization))
  t.match(ours2, {
    x402Version: 2,
    payload: {
      signature: sig2,
      authorization: { from: account.address, value: '10000', validAfter: '0', validBefore: String(now + 120) },
    },
  })

  const v1Offer = only(detectX402(answer(official.v1.answer402Body)))
  const auth1 = authorizationFor(v1Offer, { from: account.address, nonce: generatePrivateKey(), nowSeconds: now })
  const sig1 = await account.signTypedData(typedData(v1Offer, auth1, 84532, DOMAIN))
  const h1 = paymentHeaders(v1Offer, auth1, sig1)
  t.same(Object.keys(h1), ['x-payment'])
  const ours1 = decodeBase64Json(h1['x-payment'] ?? '') as Record<string, unknown>
  const theirs1 = decodeBase64Json(official.v1.officialXPayment) as Record<string, unknown>
  t.same(Object.keys(ours1), Object.keys(theirs1))
  t.same(Object.keys(ours1.payload as object), Object.keys(theirs1.payload as object))
  t.match(ours1, {
    x402Version: 1,
    scheme: 'exact',
    network: 'base-sepolia',
    payload: { signature: sig1, authorization: { validAfter: String(now - 600), validBefore: String(now + 120) } },
  })
})

t.test('official settlement headers', async (t) => {
  t.match(readSettlement({ 'x-payment-response': official.v1.xPaymentResponse }), {
    success: true,
    network: 'base-sepolia',
    transaction: /^0x[0-9a-f]{64}$/,
    payer: /^0x[0-9a-fA-F]{40}$/,
    errorReason: null,
  })
  t.match(readSettlement({ 'payment-response': official.v2.paymentResponse }), {
    success: true,
    network: 'eip155:31337',
    transaction: /^0x[0-9a-f]{64}$/,
  })
})

// ---------------------------------------------------------------------------

t.test("the spec's simple body", async (t) => {
  const body = { scheme: 'exact', network: 'base-mainnet', token: TOKEN, amount: '2500', payTo: PAY_TO, resource: 'https://api.shop.test/x' }
  const o = only(detectX402(answer(body)))
  t.match(o, { shape: 'spec-simple', network: 'base-mainnet', amount: 2500n, asset: TOKEN, payTo: PAY_TO, resource: body.resource, maxTimeoutSeconds: 60, extra: {} })
  t.equal(isPayable(o, chainOf(8453, TOKEN, 'base-mainnet')), true)
  t.equal(isPayable(o, chainOf(31337, TOKEN, 'paygate-devnet')), false)
})

t.test("the spec's server-side accepts body", async (t) => {
  const entry = {
    scheme: 'exact',
    network: 'base-mainnet',
    maxAmountRequired: '700',
    resource: 'https://shop.test/r',
    description: 'x',
    mimeType: 'text/plain',
    payToAddress: PAY_TO.toLowerCase(),
    requiredDeadlineSeconds: 30,
    asset: TOKEN,
    extra: { name: 'USDC', version: '2' },
  }
  const d = detectX402(answer({ accepts: [entry, { ...entry, maxAmountRequired: '600', payToAddress: undefined, payTo: PAY_TO }] }))
  t.equal(d.recognized, true)
  t.equal(d.offers.length, 2)
  t.match(d.offers[0], { shape: 'spec-accepts', amount: 700n, payTo: PAY_TO, maxTimeoutSeconds: 30, extra: { name: 'USDC', version: '2' }, index: 0 })
  t.match(d.offers[1], { amount: 600n, index: 1 }, 'x402 names are read too')
})

t.test('broken entries and headers never hide a good offer', async (t) => {
  const body = {
    x402Version: 1,
    accepts: [
      v1Entry({ maxAmountRequired: '1.5' }),
      v1Entry({ payTo: '0x1234' }),
      'nonsense',
      v1Entry({ maxAmountRequired: '42' }),
      v1Entry({ asset: 'So11111111111111111111111111111111111111112', network: 'solana' }),
      v1Entry({ maxTimeoutSeconds: -1 }),
      v1Entry({ extra: 'x' }),
    ],
  }
  const d = detectX402(answer(body, { 'payment-required': '%%% not base64 %%%' }))
  t.equal(d.recognized, true)
  t.equal(d.offers.length, 1)
  t.match(d.offers[0], { amount: 42n, index: 3 })
  t.same(
    d.problems.map((p) => [p.shape, p.index]),
    [
      ['x402-v2', undefined],
      ['x402-v1', 0],
      ['x402-v1', 1],
      ['x402-v1', 2],
      ['x402-v1', 4],
      ['x402-v1', 5],
      ['x402-v1', 6],
    ],
  )
  t.match(d.problems[1], { message: /maxAmountRequired/ })
  t.match(d.problems[2], { message: /payTo/ })

  // A good header and a broken body.
  const d2 = detectX402(answer('{"x402Version":1, "accepts": [', { 'payment-required': b64(v2Required([v2Entry(), v2Entry({ amount: '-5' })])) }))
  t.equal(d2.offers.length, 1)
  t.equal(d2.offers[0]?.shape, 'x402-v2')
  t.match(d2.problems, [{ shape: 'x402-v2', index: 1, message: /amount/ }, { shape: 'body' }])

  // Every entry broken: still recognized (an x402 answer we cannot pay, not a foreign one).
  const d3 = detectX402(answer({ x402Version: 1, accepts: [v1Entry({ payTo: null })] }))
  t.equal(d3.recognized, true)
  t.equal(d3.offers.length, 0)
  const d4 = detectX402(answer({ x402Version: 1, error: 'x' }))
  t.equal(d4.recognized, true)
  t.match(d4.problems, [{ message: /accepts must be an array/ }])
  const d5 = detectX402(answer({}, { 'payment-required': b64({ x402Version: 7, accepts: [] }) }))
  t.equal(d5.recognized, true)
  t.match(d5.problems, [{ message: /unsupported x402Version 7/ }])
})

t.test('several shapes in one answer are all read, v2 header first', async (t) => {
  const d = detectX402(
    answer(
      { x402Version: 1, accepts: [v1Entry({ maxAmountRequired: '5' })] },
      {
        'payment-required': [b64(v2Required([v2Entry({ amount: '9' })]))],
      },
    ),
  )
  t.same(
    d.offers.map((o) => [o.shape, o.amount]),
    [
      ['x402-v2', 9n],
      ['x402-v1', 5n],
    ],
  )
  // A v2 object in the body counts only when no v2 header was read.
  const body = v2Required([v2Entry({ amount: '3' })])
  t.same(
    detectX402(answer(body)).offers.map((o) => [o.shape, o.amount]),
    [['x402-v2', 3n]],
  )
  t.same(detectX402(answer(body, { 'payment-required': b64(v2Required([v2Entry()])) })).offers.length, 1)
})

t.test('readings are cached per header value and body, frozen, and never shared as arrays', async (t) => {
  const header = b64(v2Required([v2Entry({ amount: '7' }), v2Entry({ amount: '8', extra: { name: 'X', version: '1' } })], { extensions: { k: { v: 1 } } }))
  const a1 = detectX402(answer({}, { 'payment-required': header }))
  const a2 = detectX402(answer({}, { 'payment-required': header }))
  t.same(a1, a2, 'the same reading again')
  t.equal(a1.offers[0], a2.offers[0], 'the second call is served from the cache')
  t.not(a1.offers, a2.offers, 'each call gets its own arrays')
  a1.offers.pop()
  a1.problems.push({ shape: 'x', message: 'added by a caller' })
  const a3 = detectX402(answer({}, { 'payment-required': header }))
  t.equal(a3.offers.length, 2, 'a caller changing its arrays changes no later reading')
  t.same(a3.problems, [])

  // Cached offers cannot be altered by anyone (ESM code is strict: writes throw).
  const o = a3.offers[1]!
  t.throws(() => ((o as { amount: bigint }).amount = 1n), TypeError)
  t.throws(() => ((o.extra as { name?: string }).name = 'Y'), TypeError)
  t.throws(() => ((o.raw as { payTo: string }).payTo = OTHER), TypeError)
  t.throws(() => ((o.envelope as { extensions: { k: { v: number } } }).extensions.k.v = 2), TypeError)
  t.equal(detectX402(answer({}, { 'payment-required': header })).offers[1]?.amount, 8n)

  // Bodies too; a cached v2 body still yields to a v2 header.
  const body = v2Required([v2Entry({ amount: '3' })])
  const b1 = detectX402(answer(body))
  t.equal(detectX402(answer(body)).offers[0], b1.offers[0])
  t.same(
    detectX402(answer(body, { 'payment-required': header })).offers.map((x) => x.amount),
    [7n, 8n],
  )
  t.same(
    detectX402(answer(body)).offers.map((x) => x.amount),
    [3n],
  )

  // Problems are cached with their reading.
  const bad = detectX402(answer({ x402Version: 1, accepts: [v1Entry({ payTo: null })] }))
  t.same(detectX402(answer({ x402Version: 1, accepts: [v1Entry({ payTo: null })] })), bad)

  // Many distinct challenges: the cache stays bounded and readings stay right.
  for (let i = 1; i <= 600; i++) {
    const d = detectX402(answer({}, { 'payment-required': b64(v2Required([v2Entry({ amount: String(i) })])) }))
    if (d.offers[0]?.amount !== BigInt(i)) t.fail(`reading ${i}`)
  }
  t.equal(detectX402(answer({}, { 'payment-required': header })).offers.length, 2)
})

t.test('answers that are not x402', async (t) => {
  const cases: [string, HttpAnswer][] = [
    ['empty', answer('')],
    ['html', answer('<html><body>Pay me</body></html>')],
    ['plain text', answer('payment required')],
    ['unrelated json', answer({ error: 'payment required', price: 1 })],
    ['json array', answer([1, 2])],
    ['mpp json', answer({ protocol: 'mpp/1.0', amount: { value: '0.01', currency: 'USDC' }, paymentMethods: ['stablecoin'], sessionSupported: true, paymentEndpoint: 'https://shop.test/pay' })],
    ['mpp auth header', { status: 402, headers: { 'www-authenticate': 'Payment id="1", method="evm"' }, body: Buffer.from('{"type":"about:blank"}') }],
  ]
  for (const [name, a] of cases) {
    const d = detectX402(a)
    t.equal(d.recognized, false, name)
    t.same(d.offers, [], name)
  }
  t.match(detectX402(answer('{"broken')).problems, [{ shape: 'body' }])
  t.equal(detectX402(answer('{"broken')).recognized, false)
})

t.test('amounts are integers of base units within uint256', async (t) => {
  const max = (2n ** 256n - 1n).toString()
  t.equal(parseAmount('0', 'a'), 0n)
  t.equal(parseAmount(' 0010 ', 'a'), 10n)
  t.equal(parseAmount(max, 'a'), 2n ** 256n - 1n)
  t.equal(parseAmount(10000, 'a'), 10000n)
  for (const bad of ['1.5', '-1', '1e3', '', '0x10', '1 000', (2n ** 256n).toString(), 1.5, -3, 2 ** 60, null, undefined, {}, true]) {
    t.throws(() => parseAmount(bad, 'a'), PaygateError, `rejects ${JSON.stringify(bad)}`)
  }
  const d = detectX402(answer({ x402Version: 1, accepts: [v1Entry({ maxAmountRequired: (2n ** 256n).toString() }), v1Entry({ maxAmountRequired: max })] }))
  t.same(
    d.offers.map((o) => o.index),
    [1],
  )
})

t.test('payability', async (t) => {
  const base = only(detectX402(answer({ x402Version: 1, accepts: [v1Entry()] })))
  const at = (over: Partial<Offer>): Offer => ({ ...base, ...over })
  const sepolia = chainOf(84532)
  const cases: [string, Offer, PayableChain, boolean][] = [
    ['v1 name of the chain id', at({ network: 'base-sepolia' }), sepolia, true],
    ['v1 name, any case', at({ network: 'Base-Sepolia' }), sepolia, true],
    ['caip-2', at({ network: 'eip155:84532' }), sepolia, true],
    ['configured network name', at({ network: 'paygate-devnet' }), chainOf(31337), true],
    ['caip-2 of a local chain', at({ network: 'eip155:31337' }), chainOf(31337), true],
    ['other chain by v1 name', at({ network: 'base' }), sepolia, false],
    ['other chain by caip-2', at({ network: 'eip155:8453' }), sepolia, false],
    ['unknown name', at({ network: 'some-chain' }), sepolia, false],
    ['prototype key', at({ network: 'constructor' }), chainOf(84532, TOKEN, 'x'), false],
    ['__proto__', at({ network: '__proto__' }), chainOf(84532, TOKEN, 'x'), false],
    ['non-evm caip-2', at({ network: 'solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp' }), sepolia, false],
    ['known name beats a misleading configured name', at({ network: 'base' }), chainOf(31337, TOKEN, 'base'), false],
    ['other token', at({ asset: OTHER }), sepolia, false],
    ['token case-insensitive', at({ asset: TOKEN }), chainOf(84532, TOKEN.toLowerCase() as `0x${string}`), true],
    ['other scheme', at({ scheme: 'upto' }), sepolia, false],
    ['permit2 transfer method', at({ extra: { assetTransferMethod: 'permit2' } }), sepolia, false],
    ['explicit eip3009 method', at({ extra: { assetTransferMethod: 'eip3009' } }), sepolia, true],
    ['mpp offer', at({ protocol: 'mpp' }), sepolia, false],
  ]
  for (const [name, offer, chain, want] of cases) t.equal(isPayable(offer, chain), want, name)
  for (const [name, id] of Object.entries(X402_V1_NETWORKS)) t.equal(namesChain(name, chainOf(id)), true, name)
  t.equal(X402_V1_NETWORKS.polygon, 137)
  t.equal(X402_V1_NETWORKS['avalanche-fuji'], 43113)
})

t.test('choose: the cheapest payable offer, ties to the first', async (t) => {
  const d = detectX402(
    answer({
      x402Version: 1,
      accepts: [
        v1Entry({ maxAmountRequired: '300' }),
        v1Entry({ maxAmountRequired: '100', asset: OTHER }),
        v1Entry({ maxAmountRequired: '200', resource: 'https://a.test/x' }),
        v1Entry({ maxAmountRequired: '200', resource: 'https://b.test/x' }),
        v1Entry({ maxAmountRequired: '50', network: 'base' }),
      ],
    }),
  )
  const chain = chainOf(84532)
  t.equal(choose(d.offers, chain)?.index, 2)
  t.equal(choose(d.offers, chain, 'https://b.test/other')?.index, 3, 'other origins left out')
  t.equal(choose(d.offers, chain, 'https://c.test/'), null)
  t.equal(choose([], chain), null)
  t.equal(choose(d.offers, chainOf(1)), null)
})

t.test('sameOrigin', async (t) => {
  const cases: [string | null, string, boolean][] = [
    [null, 'https://shop.test/a', true],
    ['/relative/path', 'https://shop.test/a', true],
    ['relative', 'https://shop.test/a', true],
    ['https://shop.test/other?q=1', 'https://shop.test/a', true],
    ['https://SHOP.test:443/x', 'https://shop.test/a', true],
    ['https://shop.test:8443/x', 'https://shop.test/a', false],
    ['http://shop.test/a', 'https://shop.test/a', false],
    ['http://shop.test:8443/a', 'https://shop.test:8443/a', true],
    ['http://shop.test:8443/a', 'https://shop.test:9443/a', false],
    ['https://evil.test/a', 'https://shop.test/a', false],
    ['https://api.shop.test/a', 'https://shop.test/a', false],
    ['//evil.test/a', 'https://shop.test/a', false],
    ['urn:x402:thing', 'https://shop.test/a', false],
    ['https://shop.test/a', 'not a url', false],
  ]
  for (const [resource, url, want] of cases) t.equal(sameOrigin({ resource }, url), want, `${resource} vs ${url}`)
})

t.test('authorization window and typed data', async (t) => {
  const account = privateKeyToAccount(generatePrivateKey())
  const v1 = only(detectX402(answer({ x402Version: 1, accepts: [v1Entry({ maxTimeoutSeconds: 300 })] })))
  const nonce = generatePrivateKey()
  const a = authorizationFor(v1, { from: account.address.toLowerCase() as `0x${string}`, nonce, nowSeconds: 1000.9, maxValiditySeconds: 120 })
  t.same(a, { from: account.address, to: PAY_TO, value: 10000n, validAfter: 400n, validBefore: 1120n, nonce })
  t.equal(authorizationFor(v1, { from: account.address, nonce, nowSeconds: 100 }).validAfter, 0n, 'never negative')
  t.throws(() => authorizationFor(v1, { from: account.address, nonce: '0x1234', nowSeconds: 1 }), PaygateError)
  t.throws(() => authorizationFor(v1, { from: '0x12', nonce, nowSeconds: 1 }), PaygateError)

  const td = typedData(v1, a, 84532, { name: 'ignored', version: '0' })
  t.same(td.domain, { name: 'USD Coin', version: '2', chainId: 84532, verifyingContract: TOKEN })
  t.equal(td.primaryType, 'TransferWithAuthorization')
  const fallback = typedData({ ...v1, extra: {} }, a, 84532, { name: 'USDC', version: '2' })
  t.same(fallback.domain, { name: 'USDC', version: '2', chainId: 84532, verifyingContract: TOKEN })

  const signature = await account.signTypedData(td)
  t.equal(await recoverTypedDataAddress({ ...td, signature }), account.address)
  t.not(hashTypedData(td), hashTypedData({ ...td, domain: { ...td.domain, chainId: 8453 } }), 'chain id is bound')
  t.not(await recoverTypedDataAddress({ ...td, message: { ...td.message, value: 10001n }, signature }), account.address)
})

t.test('payment headers round-trip for every shape', async (t) => {
  const account = privateKeyToAccount(generatePrivateKey())
  const nonce = generatePrivateKey()
  const sign = async (o: Offer) => {
    const auth = authorizationFor(o, { from: account.address, nonce, nowSeconds: 1_000_000 })
    const signature = await account.signTypedData(typedData(o, auth, 84532, DOMAIN))
    return { auth, signature, headers: paymentHeaders(o, auth, signature) }
  }

  // v2 with extensions: echoed like the official client does.
  const ext = { bazaar: { info: { input: { type: 'http' } } } }
  const v2 = only(detectX402(answer('{}', { 'payment-required': b64(v2Required([v2Entry()], { extensions: ext })) })))
  const p2 = await sign(v2)
  t.same(decodeBase64Json(p2.headers['payment-signature'] ?? ''), {
    x402Version: 2,
    payload: {
      authorization: { from: account.address, to: PAY_TO, value: '10000', validAfter: '0', validBefore: '1000120', nonce },
      signature: p2.signature,
    },
    extensions: ext,
    resource: { url: 'https://shop.test/paid', description: 'd', mimeType: 'application/json' },
    accepted: v2Entry(),
  })

  const v1 = only(detectX402(answer({ x402Version: 1, accepts: [v1Entry()] })))
  const p1 = await sign(v1)
  t.same(decodeBase64Json(p1.headers['x-payment'] ?? ''), {
    x402Version: 1,
    scheme: 'exact',
    network: 'base-sepolia',
    payload: {
      signature: p1.signature,
      authorization: { from: account.address, to: PAY_TO, value: '10000', validAfter: '999400', validBefore: '1000120', nonce },
    },
  })

  for (const body of [
    { scheme: 'exact', network: 'base-mainnet', token: TOKEN, amount: '5', payTo: PAY_TO, resource: '/r' },
    { accepts: [{ scheme: 'exact', network: 'base-mainnet', maxAmountRequired: '5', payToAddress: PAY_TO, requiredDeadlineSeconds: 60, asset: TOKEN }] },
  ]) {
    const o = only(detectX402(answer(body)))
    const p = await sign(o)
    t.same(Object.keys(p.headers).sort(), ['x-payment', 'x-payment-signature'], o.shape)
    t.equal(p.headers['x-payment-signature'], p.signature)
    const decoded = decodeBase64Json(p.headers['x-payment'] ?? '')
    t.match(
      decoded,
      {
        scheme: 'exact',
        network: 'base-mainnet',
        payload: { from: account.address, to: PAY_TO, amount: '5', token: TOKEN, nonce, validAfter: '999400', validBefore: '1000060' },
        signature: p.signature,
      },
      o.shape,
    )
    // ...and also readable as an x402 v1 payment.
    t.match(decoded, { x402Version: 1, payload: { signature: p.signature, authorization: { value: '5' } } })
  }

  t.throws(() => paymentHeaders(v1, p1.auth, 'nothex' as Hex), PaygateError)
  t.throws(() => paymentHeaders(v1, { ...p1.auth, value: 9999n }, p1.signature), PaygateError, 'other amount')
  t.throws(() => paymentHeaders(v1, { ...p1.auth, to: OTHER }, p1.signature), PaygateError, 'other recipient')
  t.throws(() => paymentHeaders({ ...v1, shape: 'mpp-json' }, p1.auth, p1.signature), PaygateError)
})

t.test('base64 JSON helpers', async (t) => {
  const v = { a: 'ünïcode ₮', n: [1, 2] }
  const s = encodeBase64Json(v)
  t.match(s, /^[A-Za-z0-9+/]+=*$/)
  t.same(decodeBase64Json(s), v)
  t.same(decodeBase64Json(s.replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')), v, 'url-safe, unpadded')
  t.same(decodeBase64Json(` ${s.slice(0, 10)}\n${s.slice(10)} `), v, 'whitespace')
  t.throws(() => decodeBase64Json(''), PaygateError)
  t.throws(() => decodeBase64Json('!!!'), PaygateError)
  t.throws(() => decodeBase64Json(Buffer.from('not json').toString('base64')), PaygateError)
})

t.test('readSettlement never throws', async (t) => {
  t.equal(readSettlement({}), null)
  t.equal(readSettlement({ 'x-payment-response': '' }), null)
  const ok = b64({ success: true, transaction: '0xabc', network: 'eip155:1', payer: '0xdef' })
  const failed = b64({ success: false, errorReason: 'insufficient_funds', transaction: '', network: 'base' })
  t.match(readSettlement({ 'payment-response': ok, 'x-payment-response': failed }), { success: true, transaction: '0xabc' }, 'v2 first')
  t.same(readSettlement({ 'x-payment-response': failed }), {
    success: false,
    transaction: null,
    network: 'base',
    payer: null,
    errorReason: 'insufficient_funds',
    raw: { success: false, errorReason: 'insufficient_funds', transaction: '', network: 'base' },
  })
  t.match(readSettlement({ 'payment-response': [ok, failed] }), { success: true })
  for (const garbage of ['%%%', b64('a string'), b64([1]), b64(null), Buffer.from('{"x":').toString('base64')]) {
    t.match(readSettlement({ 'payment-response': garbage }), { success: false, errorReason: 'unreadable_payment_response', raw: garbage })
  }
  t.match(readSettlement({ 'payment-response': b64({ success: 'yes' }) }), { success: false, errorReason: null })
})

t.test('typedDataDigest equals viem hashTypedData', async (t) => {
  const offer = {
    protocol: 'x402',
    shape: 'x402-v2',
    scheme: 'exact',
    network: 'eip155:8453',
    asset: '0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913',
    amount: 12345n,
    payTo: '0x000000000000000000000000000000000000dEaD',
    resource: null,
    maxTimeoutSeconds: 60,
    extra: { name: 'USD Coin', version: '2' },
    raw: {},
    envelope: null,
    index: 0,
  } as const
  for (const [chainId, nonceByte, value] of [
    [8453, '11', 1n],
    [31337, 'ab', 10n ** 30n],
    [84532, '00', 0n],
  ] as const) {
    const data = typedData(
      offer as never,
      {
        from: '0x1111111111111111111111111111111111111111',
        to: offer.payTo,
        value,
        validAfter: 5n,
        validBefore: 1_900_000_000n,
        nonce: `0x${nonceByte.repeat(32)}`,
      },
      chainId,
      { name: 'USD Coin', version: '2' },
    )
    t.equal(typedDataDigest(data), hashTypedData(data), `chain ${chainId}`)
  }
  // Randomized: domains (cached separators included), addresses, edge values, nonces.
  const addr = (): Hex => privateKeyToAccount(generatePrivateKey()).address
  const names = ['USD Coin', 'USDC', '', 'Ünïcødé 🙂 token', 'x'.repeat(100)]
  const uints = [0n, 1n, 2n ** 256n - 1n, 2n ** 128n, 1_900_000_000n]
  let bad = 0
  for (let i = 0; i < 300; i++) {
    const data = transferTypedData(
      {
        from: addr(),
        to: addr(),
        value: uints[i % uints.length]!,
        validAfter: uints[(i + 1) % uints.length]!,
        validBefore: uints[(i + 2) % uints.length]!,
        nonce: `0x${Buffer.from(Array.from({ length: 32 }, (_, j) => (i * 31 + j * 7) & 0xff)).toString('hex')}`,
      },
      { name: names[i % names.length]!, version: String(i % 3), chainId: [1, 8453, 31337, 2 ** 31][i % 4]!, verifyingContract: i % 2 ? TOKEN : OTHER },
    )
    if (typedDataDigest(data) !== hashTypedData(data)) bad++
  }
  t.equal(bad, 0, '300 random typed data')
  const over = transferTypedData(
    { from: PAY_TO, to: PAY_TO, value: 2n ** 256n, validAfter: 0n, validBefore: 1n, nonce: `0x${'11'.repeat(32)}` },
    { name: 'USD Coin', version: '2', chainId: 1, verifyingContract: TOKEN },
  )
  t.throws(() => typedDataDigest(over), PaygateError, 'a value over uint256 is refused')
})

t.test("offers that name no domain are signed over the chain token's own domain (PayableChain.tokenDomain); extra still wins", async (t) => {
  const key = generatePrivateKey()
  const account = privateKeyToAccount(key)
  const fast = new FastSigner(key)
  const wallet = { address: account.address, signDigest: (d: Hex) => fast.signDigest65(d) }
  const req: PayRequest = { agentId: 'a', url: 'https://shop.test/paid', method: 'GET', headers: {}, body: null }
  const simple = { scheme: 'exact', network: 'base-sepolia', token: TOKEN, amount: '10000', payTo: PAY_TO, resource: 'https://shop.test/paid' }
  // Base Sepolia USDC's domain is "USDC"/"2", Base USDC's "USD Coin"/"2" (FACTS.md).
  const usdc = { name: 'USDC', version: '2' }
  const signedBy = async (stored: StoredAuthorization, domain: { name: string; version: string }) => {
    if (!isEip3009(stored)) throw new Error('expected an EIP-3009 authorization')
    return recoverTypedDataAddress({ ...transferTypedData(eip3009Of(stored), { ...domain, chainId: 84532, verifyingContract: TOKEN }), signature: stored.signature as Hex })
  }
  const signX402 = (body: unknown, chain: PayableChain) => {
    const d = new X402Adapter(null as never, 300).detect(answer(body), req, chain)
    if (!d.present || !d.plan?.prepare) throw new Error('expected an x402 plan')
    return d.plan.prepare({ req, txId: 'tx', wallet, nowMs: Date.now() }).sign()
  }

  for (const domain of [usdc, DOMAIN, { name: 'Some Token', version: '7' }]) {
    const chain = chainOf(84532, TOKEN, 'base-sepolia', domain)
    const name = `${domain.name}/${domain.version}`
    const spec = signX402(simple, chain)
    t.equal(await signedBy(spec, domain), account.address, `spec-simple signed over the token's ${name}`)
    for (const other of [usdc, DOMAIN].filter((o) => o.name !== domain.name)) t.not(await signedBy(spec, other), account.address, `not over ${other.name} on a ${name} token`)
    // The MPP adapters sign through signChainTransfer: the same domain.
    const auth = { from: account.address, to: PAY_TO, value: 5n, validAfter: 0n, validBefore: 1_900_000_000n, nonce: newNonce() }
    t.equal(await signedBy(signChainTransfer(wallet, auth, chain), domain), account.address, `signChainTransfer over the token's ${name}`)
  }
  // An offer's own extra {name, version} wins for that offer, whatever the token reported.
  const chain = chainOf(84532, TOKEN, 'base-sepolia', usdc)
  t.equal(await signedBy(signX402({ ...simple, extra: { name: 'USD Coin', version: '2' } }, chain), DOMAIN), account.address, 'spec-simple with extra')
  t.equal(await signedBy(signX402({ x402Version: 1, accepts: [v1Entry()] }, chain), DOMAIN), account.address, 'x402 v1 with extra')
})
