import t from 'tap'
import type { Hex } from 'viem'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { paymentLedgerAbi } from '../../src/chain/contracts/abis.js'
import { recordIdOf } from '../../src/chain/ledger-tx.js'
import { recordDigest, recordedEvents } from '../../src/chain/ledger-verify.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { madeAhead, madeTogether, watchSigning } from '../helpers/ledger-signing.js'
import { startSpecMerchant, startV1Merchant, startV2Merchant, type Merchant, type MerchantOptions } from '../helpers/merchants.js'

/** Real merchants (official x402 v2 and v1 packages, and the spec shapes) on the embedded chain (id 84532). */
const gw = await startTestGateway({ env: { PAYGATE_CHAIN_CHAIN_ID: '84532', PAYGATE_PAY_TIMEOUT_MS: '1500' } })
t.teardown(() => gw.close())
const { info, pub, balanceOf, merchantOptions } = await testChain(gw)

/** The receipt holds one PaymentRecorded event of the ledger for this transaction, whose digest is the contract's. */
async function recordedOnLedger(receipt: { logs: ReadonlyArray<{ address: string; topics: readonly Hex[]; data: Hex }> }, txId: string): Promise<boolean> {
  const evs = recordedEvents(receipt.logs, info.ledger)
  if (evs.length !== 1 || evs[0]!.entry.id !== recordIdOf(txId)) return false
  const { entry: e, timestamp } = evs[0]!
  const onChain = await pub.readContract({
    address: info.ledger,
    abi: paymentLedgerAbi,
    functionName: 'digestOf',
    args: [e.id, e.parentTxHash, e.agentId, e.amount, e.protocol, e.origin, e.pathHash, e.depth, timestamp],
  })
  return onChain === recordDigest(e, timestamp)
}

const PRICE = 10_000n // 0.01 USDC
const merchants: Merchant[] = []
t.teardown(async () => {
  for (const m of merchants) await m.close()
})
async function merchant(kind: 'v1' | 'v2' | 'simple' | 'accepts', extra: Partial<MerchantOptions> = {}): Promise<{ m: Merchant; payTo: Hex }> {
  const opts: MerchantOptions = { ...(await merchantOptions(PRICE)), ...extra }
  const m = kind === 'v2' ? await startV2Merchant(opts) : kind === 'v1' ? await startV1Merchant(opts) : await startSpecMerchant({ ...opts, shape: kind })
  merchants.push(m)
  return { m, payTo: opts.payTo }
}
async function agent(id: string, policy?: object): Promise<string> {
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: id } })).body.apiKey
  await gw.api('POST', '/v1/wallets', { body: { agentId: id } })
  if (policy) await gw.api('PUT', `/v1/policies/${id}`, { body: policy })
  return key
}
const walletOf = async (id: string) => (await gw.api('GET', `/v1/wallets/${id}`)).body.address as Hex

await agent('payer')

t.test('a target that does not answer 402 comes back untouched', async (t) => {
  const { m } = await merchant('v2')
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/free`, method: 'GET' } })
  t.equal(r.status, 200)
  t.same(r.body, { protocol: null, amountPaid: { usdc: 0 }, txHash: null, status: 200, data: { ok: true, free: true } })
})

for (const kind of ['v2', 'v1', 'simple', 'accepts'] as const) {
  t.test(`pays the ${kind} merchant: balances move on chain, recorded locally and on the ledger`, async (t) => {
    const { m, payTo } = await merchant(kind)
    const payer = await walletOf('payer')
    const before = await balanceOf(payer)
    const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, method: 'GET' } })
    t.equal(r.status, 200, r.text)
    t.equal(r.body.protocol, 'x402')
    t.same(r.body.amountPaid, { usdc: 0.01 })
    t.match(r.body.txHash, /^0x[0-9a-f]{64}$/)
    t.equal(r.body.status, 200)
    t.match(r.body.data, { ok: true })
    t.equal(await balanceOf(payTo), PRICE, 'merchant received the price')
    t.equal(await balanceOf(payer), before - PRICE, 'agent wallet paid it')
    t.equal(m.stats.settlements, 1)

    const tx = (await gw.api('GET', `/v1/transactions/${r.body.txHash}`)).body
    t.match(tx, { agentId: 'payer', status: 'paid', protocol: 'x402', amountPaid: { usdc: 0.01 }, txHash: r.body.txHash, depth: 0, parentTxHash: null })
    t.equal(tx.endpoint, `${m.url}/paid`)
    t.equal(tx.network, info.network, 'the network named as wallets and /v1/chain name it')
    t.ok(await gw.gw.outbox.drain(10_000), 'the ledger record is confirmed')
    const receipt = await pub.getTransactionReceipt({ hash: r.body.txHash })
    t.equal(receipt.status, 'success', 'txHash is the ledger transaction')
    t.ok(await recordedOnLedger(receipt, tx.id), 'the ledger event holds the record, and its digest is the digestOf the contract computes')
    t.equal((await gw.api('GET', `/v1/transactions/${tx.id}`)).body.ledger.status, 'confirmed')
  })
}

t.test('the ledger record of a lone payment is made while the paid retry is on the wire, once: unsigned, from the ledger account, and that is the transaction on chain', async (t) => {
  const { m } = await merchant('v2')
  const calls = watchSigning(t, gw)
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, method: 'GET' } })
  t.equal(r.status, 200, r.text)
  madeAhead(t, calls, r.body.txHash)
  t.ok(await gw.gw.outbox.drain(10_000), 'the ledger record is confirmed')
  const receipt = await pub.getTransactionReceipt({ hash: r.body.txHash })
  t.equal(receipt.status, 'success')
  const onChain = await pub.getTransaction({ hash: r.body.txHash })
  t.equal(onChain.from.toLowerCase(), gw.gw.chain.signer.address.toLowerCase(), "from the ledger signer's account")
  t.same([BigInt(onChain.r), BigInt(onChain.s)], [0n, 0n], 'with no signature')
  const tx = (await gw.api('GET', `/v1/transactions/${r.body.txHash}`)).body
  t.ok(await recordedOnLedger(receipt, tx.id), 'the ledger event holds the record')
})

t.test('payments made together are each their own transaction on chain, made in groups (unsigned: in place, no signing thread)', async (t) => {
  const { m } = await merchant('v2')
  const calls = watchSigning(t, gw)
  t.equal(calls.thread, undefined, 'the embedded chain takes unsigned records: no thread makes them')
  const rs = await Promise.all(Array.from({ length: 12 }, () => gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, method: 'GET' } })))
  for (const r of rs) t.equal(r.status, 200, r.text)
  const hashes = rs.map((r) => r.body.txHash as Hex)
  madeTogether(t, calls, hashes)
  t.ok(await gw.gw.outbox.drain(10_000), 'the ledger records are confirmed')
  for (const h of hashes) t.equal((await pub.getTransactionReceipt({ hash: h })).status, 'success')
})

t.test('a POST body is resent intact on the paid retry', async (t) => {
  const { m } = await merchant('v2')
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, method: 'POST', body: { hello: 'world', n: [1, 2, 3] } } })
  t.equal(r.status, 200, r.text)
  t.same(r.body.data, { hello: 'world', n: [1, 2, 3] })
  t.equal(m.stats.settlements, 1)
})

t.test('every policy reason rejects before funds move, recorded and emitted', async (t) => {
  const { m } = await merchant('v2')
  const host = new URL(m.url).hostname
  const seen: string[] = []
  const off = gw.gw.events.on('policy.violation', (e) => seen.push(e.reason))
  t.teardown(off)
  const cases: [string, object, string][] = [
    ['p-blocked', { blockedDomains: [host] }, 'domain_blocked'],
    ['p-allowed', { allowedDomains: ['example.com'] }, 'domain_not_allowed'],
    ['p-percall', { perCallLimit: { usdc: 0.005 } }, 'per_call_limit_exceeded'],
    ['p-budget', { dailyBudget: { usdc: 0.005 } }, 'daily_budget_exceeded'],
  ]
  for (const [id, policy, reason] of cases) {
    await agent(id, policy)
    const before = await balanceOf(await walletOf(id))
    const r = await gw.api('POST', '/v1/pay', { body: { agentId: id, endpoint: `${m.url}/paid`, method: 'GET' } })
    t.same([r.status, r.body.error, r.body.reason], [402, 'policy_violation', reason], reason)
    t.type(r.body.detail, 'string')
    t.equal(await balanceOf(await walletOf(id)), before, `${reason}: no funds spent`)
    const listed = (await gw.api('GET', `/v1/transactions?agentId=${id}&status=rejected`)).body.transactions
    t.equal(listed.length, 1)
    t.match(listed[0], { status: 'rejected', txHash: null, reason })
  }
  await agent('p-rate', { rateLimit: { calls: 1, window: '1m' } })
  t.equal((await gw.api('POST', '/v1/pay', { body: { agentId: 'p-rate', endpoint: `${m.url}/paid` } })).status, 200)
  const limited = await gw.api('POST', '/v1/pay', { body: { agentId: 'p-rate', endpoint: `${m.url}/paid` } })
  t.same([limited.status, limited.body.reason], [402, 'rate_limit_exceeded'])
  t.same(seen, ['domain_blocked', 'domain_not_allowed', 'per_call_limit_exceeded', 'daily_budget_exceeded', 'rate_limit_exceeded'])
  t.equal(m.stats.settlements, 1, 'only the allowed payment settled')
})

t.test('100 concurrent payments against a budget for exactly 10: exactly 10 paid', async (t) => {
  const { m, payTo } = await merchant('v2')
  await agent('burst', { dailyBudget: { usdc: 0.1 } })
  const results = await Promise.all(Array.from({ length: 100 }, () => gw.api('POST', '/v1/pay', { body: { agentId: 'burst', endpoint: `${m.url}/paid` } })))
  const paid = results.filter((r) => r.status === 200)
  const rejected = results.filter((r) => r.status === 402 && r.body.reason === 'daily_budget_exceeded')
  t.equal(paid.length, 10)
  t.equal(rejected.length, 90)
  t.equal(m.stats.settlements, 10)
  t.equal(await balanceOf(payTo), 10n * PRICE)
  t.match((await gw.api('GET', '/v1/policies/burst')).body.dailyBudget, { usdc: 0.1, usedToday: 0.1 })
})

t.test('budget.warning fires when 80% of the daily budget is crossed', async (t) => {
  const { m } = await merchant('v2')
  await agent('warn', { dailyBudget: { usdc: 0.05 } })
  const warnings: unknown[] = []
  const off = gw.gw.events.on('budget.warning', (e) => warnings.push(e))
  t.teardown(off)
  for (let i = 0; i < 5; i++) t.equal((await gw.api('POST', '/v1/pay', { body: { agentId: 'warn', endpoint: `${m.url}/paid` } })).status, 200)
  t.equal(warnings.length, 1, 'once, at the crossing')
  t.match(warnings[0], { agentId: 'warn', threshold: 80, usedPct: 80, usedUsdc: 0.04, dailyBudgetUsdc: 0.05 })
})

t.test('idempotency: replay, race and conflict', async (t) => {
  const { m } = await merchant('v2')
  await agent('idem')
  const body = { agentId: 'idem', endpoint: `${m.url}/paid`, method: 'GET', idempotencyKey: 'order-1' }
  const [a, b] = await Promise.all([gw.api('POST', '/v1/pay', { body }), gw.api('POST', '/v1/pay', { body })])
  t.equal(a.status, 200)
  t.same(b.body, a.body, 'the racing call gets the same result')
  const c = await gw.api('POST', '/v1/pay', { body })
  t.same(c.body, a.body, 'a replay gets the stored result')
  t.equal(m.stats.settlements, 1, 'paid once')
  const conflict = await gw.api('POST', '/v1/pay', { body: { ...body, method: 'POST', body: { x: 1 } } })
  t.same([conflict.status, conflict.body.error], [409, 'idempotency_conflict'])
  const other = await gw.api('POST', '/v1/pay', { body: { ...body, agentId: 'payer' } })
  t.equal(other.status, 200, 'keys are per agent')
})

t.test('a merchant that answers 402 again after settling is not paid again', async (t) => {
  const { m } = await merchant('simple', { faults: { again402AfterPayment: true } })
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid` } })
  t.equal(m.stats.settlements, 1, 'one settlement')
  t.equal(r.status, 200)
  t.equal(r.body.status, 402, 'the target answer is passed on')
  t.match(r.body.txHash, /^0x/, 'recorded as paid')
})

t.test('a settle that times out once: the same authorization, one settlement', async (t) => {
  const { m } = await merchant('simple', { faults: { hangOnceMs: 2500 } })
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid` } })
  t.equal(r.status, 200, r.text)
  t.equal(m.stats.settlements, 1)
  t.match(r.body.txHash, /^0x/)
})

t.test('a merchant that settles, then drops the connection: recorded as paid, and the lost answer says so', async (t) => {
  const { m } = await merchant('simple', { faults: { failSettleOnce: true } })
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid` } })
  t.equal(r.status, 200, r.text)
  t.equal(m.stats.settlements, 1, 'one settlement')
  t.match(r.body.txHash, /^0x/, 'recorded as paid')
  t.equal(r.body.status, 502)
  t.match(r.body.data, { error: 'upstream_answer_lost', detail: /payment settled.*do not pay again/ }, 'the answer says the money moved and what to do')
})

t.test('a merchant that takes payment then answers 500: recorded, not paid again', async (t) => {
  const { m } = await merchant('v2', { faults: { error500AfterPayment: true } })
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid` } })
  t.equal(r.status, 200, r.text)
  t.equal(r.body.status, 500)
  t.match(r.body.txHash, /^0x/)
  t.equal(m.stats.settlements, 1)
  t.equal((await gw.api('GET', `/v1/transactions/${r.body.txHash}`)).body.status, 'paid')
})

t.test('unrecognised and unpayable 402s', async (t) => {
  const plain = createServer((req, res) => {
    if (req.url === '/other-chain') {
      res.writeHead(402, { 'content-type': 'application/json' })
      res.end(
        JSON.stringify({ scheme: 'exact', network: 'eip155:1', token: info.token, amount: '10', payTo: info.token, resource: `http://127.0.0.1:${(plain.address() as AddressInfo).port}/other-chain` }),
      )
      return
    }
    res.writeHead(402, { 'content-type': 'text/plain' })
    res.end('pay me somehow')
  })
  await new Promise<void>((r) => plain.listen(0, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => plain.close(() => r())))
  const base = `http://127.0.0.1:${(plain.address() as AddressInfo).port}`
  const u = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${base}/x` } })
  t.same([u.status, u.body.error], [502, 'payment_protocol_error'])
  const n = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${base}/other-chain` } })
  t.same([n.status, n.body.error], [402, 'no_payable_offer'])
})

t.test('insufficient funds: required and available', async (t) => {
  const { m } = await merchant('v2', { price: 2_000_000_000n })
  await agent('poor')
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'poor', endpoint: `${m.url}/paid` } })
  t.same([r.status, r.body.error], [402, 'insufficient_funds'])
  t.same(r.body.required, { usdc: 2000 })
  t.same(r.body.available, { usdc: 1000 })
  t.equal(m.stats.settlements, 0)
})

t.test('a signature that cannot be made: nothing is sent, the transaction fails and its reservation is released', async (t) => {
  const { m } = await merchant('v2')
  await agent('nosign', { dailyBudget: { usdc: 1 } })
  const signer = await gw.gw.wallets.wallets.signer('nosign')
  const sign = signer.signDigest65
  signer.signDigest65 = () => {
    throw new Error('no key today')
  }
  t.teardown(() => {
    signer.signDigest65 = sign
  })
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'nosign', endpoint: `${m.url}/paid` } })
  t.equal(r.status, 500, r.text)
  t.equal(m.stats.paidAttempts, 0, 'no payment reached the merchant')
  const txs = (await gw.api('GET', '/v1/transactions?agentId=nosign')).body.transactions
  t.equal(txs.length, 1)
  t.match(txs[0], { status: 'failed', error: 'signing failed: no key today', amountPaid: { usdc: 0 } })
  t.same((await gw.gw.policies.usageOf('nosign')).holds, [], 'the reservation was released')
  signer.signDigest65 = sign
  const again = await gw.api('POST', '/v1/pay', { body: { agentId: 'nosign', endpoint: `${m.url}/paid` } })
  t.equal(again.status, 200, again.text)
  t.same((await gw.api('GET', '/v1/policies/nosign')).body.dailyBudget, { usdc: 1, usedToday: 0.01 }, 'only the paid call counts')
})

t.test('pay request validation and access', async (t) => {
  const key = (await gw.api('POST', '/v1/agents/payer/keys')).body.apiKey
  const other = await agent('other-agent')
  const cases: [object, string][] = [
    [{ endpoint: 'http://x' }, 'agentId'],
    [{ agentId: 'payer' }, 'endpoint'],
    [{ agentId: 'payer', endpoint: 'ftp://x/y' }, 'endpoint'],
    [{ agentId: 'payer', endpoint: 'http://x', method: 'FETCH' }, 'method'],
    [{ agentId: 'payer', endpoint: 'http://x', idempotencyKey: '' }, 'idempotencyKey'],
    [{ agentId: 'payer', endpoint: 'http://x', parentTxHash: '0x12' }, 'parentTxHash'],
    [{ agentId: 'payer', endpoint: 'http://x', headers: { 'bad header': 'x' } }, 'headers.bad header'],
  ]
  for (const [body, field] of cases) {
    const r = await gw.api('POST', '/v1/pay', { body })
    t.same([r.status, r.body.field], [400, field], field)
  }
  t.equal((await gw.api('POST', '/v1/pay', { key: other, body: { agentId: 'payer', endpoint: 'http://127.0.0.1:1/' } })).status, 403, 'another agent')
  t.equal((await gw.api('GET', '/v1/transactions?agentId=payer', { key: other })).status, 403)
  const own = await gw.api('GET', '/v1/transactions', { key })
  t.equal(own.status, 200)
  t.ok(
    own.body.transactions.every((x: { agentId: string }) => x.agentId === 'payer'),
    'an agent key lists only its own',
  )
  const page = await gw.api('GET', '/v1/transactions?agentId=payer&limit=2')
  t.equal(page.body.transactions.length, 2)
  const next = await gw.api('GET', `/v1/transactions?agentId=payer&limit=2&cursor=${page.body.nextCursor}`)
  t.not(next.body.transactions[0].id, page.body.transactions[0].id, 'the cursor pages on')
  t.ok(page.body.transactions[0].timestamp >= page.body.transactions[1].timestamp, 'newest first')
})

t.test('parentTxHash links a payment to its parent: depth is the parent depth + 1', async (t) => {
  const { m } = await merchant('v2')
  const root = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid` } })
  const child = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, parentTxHash: root.body.txHash } })
  t.equal(child.status, 200, child.text)
  const grand = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, parentTxHash: child.body.txHash } })
  const c = (await gw.api('GET', `/v1/transactions/${child.body.txHash}`)).body
  const g = (await gw.api('GET', `/v1/transactions/${grand.body.txHash}`)).body
  t.same([c.depth, c.parentTxHash], [1, root.body.txHash])
  t.same([g.depth, g.parentTxHash], [2, child.body.txHash])
  const unknown = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, parentTxHash: `0x${'ab'.repeat(32)}` } })
  t.same([unknown.status, unknown.body.field], [400, 'parentTxHash'])
})
