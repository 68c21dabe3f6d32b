/**
 * Self-test of test/helpers/merchants.ts: a local chain (chain id 84532, so the v1
 * merchant's "base-sepolia" works too), PaygateUSDC deployed, a payer funded, and each
 * merchant paid with a payment built by src/protocols/x402.ts and signed by viem. Checks
 * the answers, the settlement headers, the balances on chain, replay refusal and the
 * fault options.
 */
import t from 'tap'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createPublicClient, createWalletClient, defineChain, http as viemHttp, type Hex, type PublicClient } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { bytecodes, paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { startDevnet } from '../../src/chain/devnet/index.js'
import type { Address, HttpAnswer, Offer, PayableChain } from '../../src/protocols/types.js'
import { authorizationFor, choose, detectX402, paymentHeaders, readSettlement, typedData } from '../../src/protocols/x402.js'
import { startSpecMerchant, startV1Merchant, startV2Merchant, type Merchant, type MerchantOptions } from '../helpers/merchants.js'

const CHAIN_ID = 84532
const PRICE = 10_000n
const STEP_TIMEOUT_MS = 15_000

// ---------------------------------------------------------------------------
// local chain: the project's embedded devnet

interface LocalNode {
  rpcUrl: string
  via: string
  close(): Promise<void>
}

async function startLocalChain(chainId: number): Promise<LocalNode> {
  const dataDir = mkdtempSync(join(tmpdir(), 'paygate-merchants-chain-'))
  const d = await startDevnet({ dataDir, chainId, host: '127.0.0.1', port: 0 })
  return {
    rpcUrl: d.rpcUrl,
    via: 'devnet',
    async close() {
      await d.close()
      rmSync(dataDir, { recursive: true, force: true })
    },
  }
}

// ---------------------------------------------------------------------------
// paying, the way the engine will: fetch, detect, choose, sign, retry

const answerOf = async (res: Response): Promise<HttpAnswer> => {
  const headers: Record<string, string> = {}
  res.headers.forEach((v, k) => {
    headers[k] = v
  })
  return { status: res.status, headers, body: Buffer.from(await res.arrayBuffer()) }
}

interface RequestSpec {
  method?: 'GET' | 'POST'
  body?: string
}

const send = async (url: string, req: RequestSpec, headers: Record<string, string> = {}, timeoutMs = STEP_TIMEOUT_MS): Promise<HttpAnswer> =>
  answerOf(
    await fetch(url, {
      method: req.method ?? 'GET',
      headers: { ...(req.body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
      ...(req.body !== undefined ? { body: req.body } : {}),
      signal: AbortSignal.timeout(timeoutMs),
    }),
  )

const payer = privateKeyToAccount(generatePrivateKey())
const deployer = privateKeyToAccount(generatePrivateKey())
const facilitatorKey = generatePrivateKey()

let node: LocalNode
let pub: PublicClient
let token: Address
let payable: PayableChain

/** The 402 answer and the offer Paygate would choose, plus signed payment headers for it. */
async function signedPayment(url: string, req: RequestSpec = {}): Promise<{ first: HttpAnswer; offer: Offer; headers: Record<string, string> }> {
  const first = await send(url, req)
  if (first.status !== 402) throw new Error(`expected 402 from ${url}, got ${first.status}`)
  const offer = choose(detectX402(first).offers, payable, url)
  if (!offer) throw new Error(`nothing payable at ${url}: ${first.body.toString()}`)
  const auth = authorizationFor(offer, { from: payer.address, nonce: generatePrivateKey(), nowSeconds: Date.now() / 1000 })
  const signature = await payer.signTypedData(typedData(offer, auth, CHAIN_ID, { name: 'USD Coin', version: '2' }))
  return { first, offer, headers: paymentHeaders(offer, auth, signature) }
}

const balanceOf = (a: Address): Promise<bigint> => pub.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [a] })

async function waitFor(cond: () => boolean, what: string, ms = STEP_TIMEOUT_MS): Promise<void> {
  const end = Date.now() + ms
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

const newPayTo = (): Address => privateKeyToAccount(generatePrivateKey()).address
const baseOpts = (payTo: Address): MerchantOptions => ({ chain: { rpcUrl: node.rpcUrl, chainId: CHAIN_ID, token }, facilitatorKey, payTo, price: PRICE })

// ---------------------------------------------------------------------------

const started = Date.now()

t.before(async () => {
  node = await startLocalChain(CHAIN_ID)
  const chain = defineChain({
    id: CHAIN_ID,
    name: 'local',
    nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: [node.rpcUrl] } },
  })
  pub = createPublicClient({ chain, transport: viemHttp(node.rpcUrl), pollingInterval: 25 }) as PublicClient
  for (const a of [deployer.address, privateKeyToAccount(facilitatorKey).address]) {
    const params = [a, `0x${(10n ** 21n).toString(16)}`]
    await pub.request({ method: 'anvil_setBalance' as never, params: params as never }).catch(() => pub.request({ method: 'hardhat_setBalance' as never, params: params as never }))
  }
  const wallet = createWalletClient({ chain, transport: viemHttp(node.rpcUrl), account: deployer, pollingInterval: 25 })
  const deployHash = await wallet.deployContract({ abi: paygateUsdcAbi, bytecode: bytecodes.PaygateUSDC as Hex, args: [deployer.address] })
  const deployed = await pub.waitForTransactionReceipt({ hash: deployHash, timeout: STEP_TIMEOUT_MS })
  if (!deployed.contractAddress) throw new Error('token deployment failed')
  token = deployed.contractAddress
  const mintHash = await wallet.writeContract({ address: token, abi: paygateUsdcAbi, functionName: 'mint', args: [payer.address, 1_000_000_000n] })
  await pub.waitForTransactionReceipt({ hash: mintHash, timeout: STEP_TIMEOUT_MS })
  payable = { chainId: CHAIN_ID, networkName: 'paygate-devnet', token, tokenDomain: { name: 'USD Coin', version: '2' } }
  t.comment(`chain via ${node.via}, ready in ${Date.now() - started} ms`)
})

t.teardown(async () => {
  await node?.close()
  t.comment(`merchants self-test: ${Date.now() - started} ms in all`)
})

const kinds: Array<{ name: string; label: string; shape: string; start: (o: MerchantOptions) => Promise<Merchant>; settlementHeader: string }> = [
  { name: 'official v2 (@x402/express)', label: 'v2', shape: 'x402-v2', start: startV2Merchant, settlementHeader: 'payment-response' },
  { name: 'official v1 (x402-express)', label: 'v1', shape: 'x402-v1', start: startV1Merchant, settlementHeader: 'x-payment-response' },
  {
    name: 'spec simple shape, v,r,s settlement',
    label: 'spec',
    shape: 'spec-simple',
    start: (o) => startSpecMerchant({ ...o, shape: 'simple', signatureForm: 'vrs' }),
    settlementHeader: 'x-payment-response',
  },
  {
    name: 'spec accepts shape, bytes settlement',
    label: 'spec',
    shape: 'spec-accepts',
    start: (o) => startSpecMerchant({ ...o, shape: 'accepts', signatureForm: 'bytes' }),
    settlementHeader: 'x-payment-response',
  },
]

for (const k of kinds) {
  t.test(k.name, async (t) => {
    const payTo = newPayTo()
    const m = await k.start(baseOpts(payTo))
    t.teardown(() => m.close())

    const free = await send(`${m.url}/free`, {})
    t.equal(free.status, 200, 'free route needs no payment')

    // GET /paid
    const url = `${m.url}/paid`
    const p0 = await balanceOf(payer.address)
    const { offer, headers } = await signedPayment(url)
    t.equal(offer.shape, k.shape, `offer shape ${offer.shape}, network ${offer.network}`)
    const t0 = Date.now()
    const paid = await send(url, {}, headers)
    const paidMs = Date.now() - t0
    t.equal(paid.status, 200, `paid GET answered 200 in ${paidMs} ms`)
    t.same(JSON.parse(paid.body.toString()), { ok: true, paid: k.label })
    t.ok(paid.headers[k.settlementHeader], `carries ${k.settlementHeader}`)
    const s = readSettlement(paid.headers)
    t.equal(s?.success, true, 'settlement reported')
    t.equal(s?.payer?.toLowerCase(), payer.address.toLowerCase())
    t.equal(s?.network, m.network)
    const tx = s?.transaction as Hex
    t.match(tx, /^0x[0-9a-f]{64}$/)
    t.same(m.stats.transactions, [tx])
    const receipt = await pub.getTransactionReceipt({ hash: tx })
    t.equal(receipt.status, 'success', 'settlement transaction mined')
    t.equal(await balanceOf(payTo), PRICE, 'merchant got paid')
    t.equal(await balanceOf(payer.address), p0 - PRICE, 'payer paid once')

    // POST /paid echoes the body of the paid retry
    const body = JSON.stringify({ hello: 'wörld', n: [1, 2, 3], nested: { a: null } })
    const post = await signedPayment(url, { method: 'POST', body })
    const echoed = await send(url, { method: 'POST', body }, post.headers)
    t.equal(echoed.status, 200)
    t.equal(echoed.body.toString('utf8'), body, 'body resent intact')
    t.equal(readSettlement(echoed.headers)?.success, true)
    t.equal(await balanceOf(payTo), 2n * PRICE)

    // the same payment again is refused and moves nothing
    const replay = await send(url, {}, headers)
    t.equal(replay.status, 402, 'replayed payment refused')
    t.equal(readSettlement(replay.headers), null, 'no settlement on a replay')
    t.equal(await balanceOf(payTo), 2n * PRICE, 'no money moved on replay')
    t.equal(m.stats.settlements, 2)
    t.equal(m.stats.paidServed, 2)
    t.equal(m.stats.rejected, 1)
    t.ok(m.stats.verifyCalls >= 2, `verify calls: ${m.stats.verifyCalls}`)
    t.comment(`${k.name}: stats ${JSON.stringify({ ...m.stats, transactions: m.stats.transactions.length })}`)
  })
}

t.test('spec merchant refuses a proof whose X-PAYMENT-SIGNATURE does not match', async (t) => {
  const m = await startSpecMerchant({ ...baseOpts(newPayTo()), shape: 'accepts' })
  t.teardown(() => m.close())
  const url = `${m.url}/paid`
  const { headers } = await signedPayment(url)
  const other = await signedPayment(url)
  const bad = await send(url, {}, { ...headers, 'x-payment-signature': other.headers['x-payment-signature'] ?? '' })
  t.equal(bad.status, 402)
  t.match(JSON.parse(bad.body.toString()), { error: /invalid_signature/, accepts: [{ payToAddress: String }] })
  t.equal(m.stats.settlements, 0)
})

t.test('concurrent payments to merchants sharing one facilitator key', async (t) => {
  const payTos = [newPayTo(), newPayTo(), newPayTo()]
  const ms = [await startV2Merchant(baseOpts(payTos[0]!)), await startV1Merchant(baseOpts(payTos[1]!)), await startSpecMerchant({ ...baseOpts(payTos[2]!), shape: 'simple' })]
  t.teardown(() => Promise.all(ms.map((m) => m.close())))
  const rounds = 3
  const t0 = Date.now()
  const answers = await Promise.all(
    ms.flatMap((m) =>
      Array.from({ length: rounds }, async () => {
        const url = `${m.url}/paid`
        const { headers } = await signedPayment(url)
        return send(url, {}, headers)
      }),
    ),
  )
  t.same(
    answers.map((a) => a.status),
    Array(ms.length * rounds).fill(200),
    `${answers.length} concurrent payments in ${Date.now() - t0} ms`,
  )
  for (const a of payTos) t.equal(await balanceOf(a), BigInt(rounds) * PRICE)
})

t.test('faults', async (t) => {
  t.test('v2 again402AfterPayment: settles, then answers the challenge again', async (t) => {
    const payTo = newPayTo()
    const m = await startV2Merchant({ ...baseOpts(payTo), faults: { again402AfterPayment: 1 } })
    t.teardown(() => m.close())
    const url = `${m.url}/paid`
    const { headers } = await signedPayment(url)
    const a = await send(url, {}, headers)
    t.equal(a.status, 402)
    t.equal(readSettlement(a.headers), null, 'no settlement header')
    t.ok(detectX402(a).offers.length > 0, 'a fresh challenge')
    t.equal(await balanceOf(payTo), PRICE, 'but the money moved')
    t.equal(m.stats.settlements, 1)
    t.equal(m.stats.faultsInjected, 1)
    // budget of 1: the next payment is served normally
    const next = await signedPayment(url)
    t.equal((await send(url, {}, next.headers)).status, 200)
  })

  t.test('v1 error500AfterPayment: settles, then 500 with the receipt', async (t) => {
    const payTo = newPayTo()
    const m = await startV1Merchant({ ...baseOpts(payTo), faults: { error500AfterPayment: true } })
    t.teardown(() => m.close())
    const url = `${m.url}/paid`
    const { headers } = await signedPayment(url)
    const a = await send(url, {}, headers)
    t.equal(a.status, 500)
    t.match(JSON.parse(a.body.toString()), { error: 'internal_error' })
    t.equal(readSettlement(a.headers)?.success, true, 'receipt kept')
    t.equal(await balanceOf(payTo), PRICE)
  })

  t.test('v1 hangOnceMs: the client times out while the money moves', async (t) => {
    const payTo = newPayTo()
    const m = await startV1Merchant({ ...baseOpts(payTo), faults: { hangOnceMs: 5_000 } })
    t.teardown(() => m.close())
    const url = `${m.url}/paid`
    const { headers } = await signedPayment(url)
    await t.rejects(send(url, {}, headers, 1_000), 'client timed out')
    await waitFor(() => m.stats.settlements === 1, 'settlement')
    t.equal(await balanceOf(payTo), PRICE)
    // only once
    const next = await signedPayment(url)
    t.equal((await send(url, {}, next.headers)).status, 200)
  })

  t.test('spec failSettleOnce after-settle: connection dropped after the money moved', async (t) => {
    const payTo = newPayTo()
    const m = await startSpecMerchant({ ...baseOpts(payTo), shape: 'simple', faults: { failSettleOnce: true } })
    t.teardown(() => m.close())
    const url = `${m.url}/paid`
    const { headers } = await signedPayment(url)
    await t.rejects(send(url, {}, headers), 'connection destroyed')
    t.equal(m.stats.settlements, 1)
    t.equal(await balanceOf(payTo), PRICE)
    const again = await send(url, {}, headers)
    t.equal(again.status, 402, 'resending the same payment is refused')
    t.match(JSON.parse(again.body.toString()), { error: 'authorization_already_used' })
  })

  t.test('v2 failSettleOnce before-settle: dropped, nothing moved, same payment later succeeds', async (t) => {
    const payTo = newPayTo()
    const m = await startV2Merchant({ ...baseOpts(payTo), faults: { failSettleOnce: 'before-settle' } })
    t.teardown(() => m.close())
    const url = `${m.url}/paid`
    const { headers } = await signedPayment(url)
    await t.rejects(send(url, {}, headers), 'connection destroyed')
    t.equal(m.stats.settleCalls, 0)
    t.equal(await balanceOf(payTo), 0n)
    const again = await send(url, {}, headers)
    t.equal(again.status, 200)
    t.equal(await balanceOf(payTo), PRICE)
  })

  t.test('spec again402AfterPayment, error500AfterPayment and before-settle', async (t) => {
    const payTo = newPayTo()
    const m = await startSpecMerchant({ ...baseOpts(payTo), shape: 'accepts', faults: { again402AfterPayment: 1 } })
    t.teardown(() => m.close())
    const url = `${m.url}/paid`
    let p = await signedPayment(url)
    let a = await send(url, {}, p.headers)
    t.equal(a.status, 402)
    t.equal(a.headers['x-payment-response'], undefined)
    t.equal(await balanceOf(payTo), PRICE)

    m.setFaults({ error500AfterPayment: 1 })
    p = await signedPayment(url)
    a = await send(url, {}, p.headers)
    t.equal(a.status, 500)
    t.equal(readSettlement(a.headers)?.success, true)
    t.equal(await balanceOf(payTo), 2n * PRICE)

    m.setFaults({ failSettleOnce: 'before-settle' })
    p = await signedPayment(url)
    await t.rejects(send(url, {}, p.headers))
    t.equal(await balanceOf(payTo), 2n * PRICE)
    a = await send(url, {}, p.headers)
    t.equal(a.status, 200)
    t.equal(await balanceOf(payTo), 3n * PRICE)
    t.equal(m.stats.faultsInjected, 3)
  })
})
