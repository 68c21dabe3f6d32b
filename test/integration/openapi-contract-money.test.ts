import t, { type Test } from 'tap'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { send } from '../helpers/contract-client.js'
import { AREAS, MAX_BODY_BYTES, assertCoverage, concrete, contractGateway, sweep401, sweep405, sweep429 } from '../helpers/contract-sweeps.js'
import { testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * The API contract, part 2 of 3 (paying, transactions and their trees, invocations, runs,
 * metrics): every route of this area driven for real against a real x402 merchant on the
 * embedded chain, its success and each documented error, every answer held to
 * docs/openapi.json. Part 1 (openapi-contract-core) checks the document against the router.
 */
const { gw, contract, call } = await contractGateway(t, (c) => {
  c.invoke.timeoutMs = 1500
})
const acct = gw.accountKey
const { merchantOptions } = await testChain(gw)
const merchant = await startV2Merchant(await merchantOptions(10_000n))
t.teardown(() => merchant.close())
const paid = `${merchant.url}/paid`
// 5000 USDC a call: more than a wallet the faucet filled (1000) holds.
const dear = await startV2Merchant(await merchantOptions(5_000_000_000n))
t.teardown(() => dear.close())

/** A sub-agent answering each task with `answer` (or never, for `hang`). */
async function subAgent(t: Test, answer: { status: number; body: unknown } | 'hang'): Promise<string> {
  const s: Server = createServer((req, res) => {
    req.resume()
    if (answer === 'hang') return
    res.writeHead(answer.status, { 'content-type': 'application/json' }).end(JSON.stringify(answer.body))
  })
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    s.closeAllConnections()
    s.close()
  })
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}/task`
}

let keyA = ''
let keyB = ''
let pay: { transactionId: string; txHash: string } = { transactionId: '', txHash: '' }
let invocationTx = ''

t.test('setup: agents with wallets (m-c pays only once the chain is gone)', async (t) => {
  for (const agentId of ['m-a', 'm-b', 'm-c']) {
    const key = (await call(t, { method: 'POST', path: '/v1/agents', key: acct, body: { agentId } }, 201)).body.apiKey
    await call(t, { method: 'POST', path: '/v1/wallets', key: acct, body: { agentId } }, 201)
    if (agentId === 'm-a') keyA = key
    if (agentId === 'm-b') keyB = key
  }
})

t.test('POST /v1/pay', async (t) => {
  const ok = await call(t, { method: 'POST', path: '/v1/pay', key: keyA, body: { agentId: 'm-a', endpoint: paid, idempotencyKey: 'k1' } }, 200)
  t.match(ok.body, { protocol: 'x402', amountPaid: { usdc: 0.01 }, status: 200 })
  pay = ok.body
  const free = await call(t, { method: 'POST', path: '/v1/pay', key: acct, body: { agentId: 'm-a', endpoint: `${merchant.url}/free` } }, 200)
  t.same([free.body.protocol, free.body.txHash], [null, null], 'a free answer: nothing paid')
  t.equal((await call(t, { method: 'POST', path: '/v1/pay', key: acct, body: { agentId: 'm-a' } }, 400, 'invalid_request')).body.field, 'endpoint')
  await call(t, { method: 'POST', path: '/v1/pay', key: keyA, body: { agentId: 'm-a', endpoint: paid, method: 'POST', idempotencyKey: 'k1' } }, 409, 'idempotency_conflict')
  await call(t, { method: 'POST', path: '/v1/pay', key: keyB, body: { agentId: 'm-a', endpoint: paid } }, 403, 'forbidden')
  await call(t, { method: 'POST', path: '/v1/pay', key: acct, body: { agentId: 'nobody', endpoint: paid } }, 404, 'not_found')
  await call(t, { method: 'POST', path: '/v1/pay', key: acct, body: { agentId: 'm-a', endpoint: 'http://127.0.0.1:9/x' } }, 502, 'upstream_unreachable')
  await send(gw.url, { method: 'PUT', path: '/v1/policies/m-b', key: acct, body: { perCallLimit: { usdc: 0.001 } } })
  const refused = await call(t, { method: 'POST', path: '/v1/pay', key: keyB, body: { agentId: 'm-b', endpoint: paid } }, 402, 'policy_violation')
  t.equal(refused.body.reason, 'per_call_limit_exceeded')
  const poor = await call(t, { method: 'POST', path: '/v1/pay', key: keyA, body: { agentId: 'm-a', endpoint: `${dear.url}/paid` } }, 402, 'insufficient_funds')
  t.same(poor.body.required, { usdc: 5000 })
})

t.test('transactions, their chains and trees', async (t) => {
  await call(t, { method: 'GET', path: '/v1/transactions?agentId=m-a&limit=5', key: acct }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/transactions?agentId=m-b&status=rejected', key: keyB }, 200)).body.transactions.length, 1)
  t.equal((await call(t, { method: 'GET', path: '/v1/transactions?status=lost', key: acct }, 400, 'invalid_request')).body.field, 'status')
  await call(t, { method: 'GET', path: '/v1/transactions?agentId=m-a', key: keyB }, 403, 'forbidden')
  // An agent that does not exist is 404; one with no transactions is an empty page; a deleted
  // agent's history stays listed.
  t.equal((await call(t, { method: 'GET', path: '/v1/transactions?agentId=m-ghost', key: acct }, 404, 'not_found')).body.detail, 'agent m-ghost does not exist')
  t.same((await call(t, { method: 'GET', path: '/v1/transactions?agentId=m-c', key: acct }, 200)).body.transactions, [])
  await send(gw.url, { method: 'POST', path: '/v1/wallets', key: acct, body: { agentId: 'm-gone' } })
  await send(gw.url, { method: 'PUT', path: '/v1/policies/m-gone', key: acct, body: { perCallLimit: { usdc: 0.001 } } })
  await call(t, { method: 'POST', path: '/v1/pay', key: acct, body: { agentId: 'm-gone', endpoint: paid } }, 402, 'policy_violation')
  await call(t, { method: 'DELETE', path: '/v1/agents/m-gone', key: acct }, 204)
  const gone = (await call(t, { method: 'GET', path: '/v1/transactions?agentId=m-gone', key: acct }, 200)).body.transactions
  t.same(
    gone.map((x: { status: string }) => x.status),
    ['rejected'],
    "a deleted agent's history",
  )
  await call(t, { method: 'GET', path: `/v1/transactions/${pay.transactionId}`, key: keyA }, 200)
  await call(t, { method: 'GET', path: `/v1/transactions/${pay.txHash}`, key: acct }, 200)
  await call(t, { method: 'GET', path: '/v1/transactions/tx_nothing', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: `/v1/transactions/${pay.transactionId}`, key: keyB }, 403, 'forbidden')
  for (const what of ['chain', 'tree']) {
    await call(t, { method: 'GET', path: `/v1/transactions/${pay.txHash}/${what}`, key: keyA }, 200)
    await call(t, { method: 'GET', path: `/v1/transactions/0x${'0'.repeat(64)}/${what}`, key: acct }, 404, 'not_found')
    await call(t, { method: 'GET', path: `/v1/transactions/${pay.txHash}/${what}`, key: keyB }, 403, 'forbidden')
  }
})

t.test('POST /v1/agents/invoke', async (t) => {
  const invoke = (body: Record<string, unknown>, o: { key?: string; agent?: string; headers?: Record<string, string> } = {}) => ({
    method: 'POST',
    path: '/v1/agents/invoke',
    key: o.key ?? keyA,
    headers: { 'x-agent-id': o.agent ?? 'm-a', ...o.headers },
    body,
  })
  const done = await subAgent(t, { status: 200, body: { output: { answer: 42 } } })
  const ok = await call(t, invoke({ agentEndpoint: done, task: { q: 'x' }, budget: { usdc: 0.05 }, runId: 'run-1', idempotencyKey: 'i1' }), 200)
  t.same(ok.body.output, { answer: 42 })
  invocationTx = ok.body.txHash
  await call(t, invoke({ agentEndpoint: done, task: { q: 'other' }, budget: { usdc: 0.05 }, runId: 'run-1', idempotencyKey: 'i1' }), 409, 'idempotency_conflict')
  t.equal((await call(t, invoke({ agentEndpoint: done, task: {} }), 400, 'invalid_request')).body.field, 'budget')
  await call(t, invoke({ agentEndpoint: done, task: {}, budget: { usdc: 0.01 } }, { key: keyB }), 403, 'forbidden')
  await call(t, invoke({ agentEndpoint: done, task: {}, budget: { usdc: 0.01 } }, { key: acct, agent: 'nobody' }), 404, 'not_found')
  const closed = { 'x-paygate-invocation': `pgi_${'0'.repeat(64)}` }
  await call(t, invoke({ agentEndpoint: done, task: {}, budget: { usdc: 0.01 } }, { headers: closed }), 402, 'budget_exceeded')
  const failing = await subAgent(t, { status: 500, body: { error: 'boom' } })
  t.equal((await call(t, invoke({ agentEndpoint: failing, task: {}, budget: { usdc: 0.01 } }), 502, 'sub_agent_failed')).body.upstreamStatus, 500)
  const hanging = await subAgent(t, 'hang')
  await call(t, invoke({ agentEndpoint: hanging, task: {}, budget: { usdc: 0.01 } }), 504, 'sub_agent_failed')
  await call(t, { method: 'GET', path: `/v1/transactions/${invocationTx}/tree`, key: acct }, 200)
})

t.test('runs', async (t) => {
  await call(t, { method: 'GET', path: '/v1/runs?agentId=m-a', key: acct }, 200)
  await call(t, { method: 'GET', path: '/v1/runs', key: keyA }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/runs', key: acct }, 400, 'invalid_request')).body.field, 'agentId')
  await call(t, { method: 'GET', path: '/v1/runs?agentId=m-a', key: keyB }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/runs/run-1?agentId=m-a', key: acct }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/runs/bad%20run?agentId=m-a', key: acct }, 400, 'invalid_request')).body.field, 'runId')
  await call(t, { method: 'GET', path: '/v1/runs/run-9?agentId=m-a', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: '/v1/runs/run-1?agentId=m-a', key: keyB }, 403, 'forbidden')
})

t.test('metrics', async (t) => {
  const all = 'spend,tx_count,protocol_split,rejected_count,avg_cost,max_cost,top_endpoints,paid_latency,budget_used_pct,session_calls,delegated_spend,spend_series'
  await call(t, { method: 'GET', path: `/v1/agents/m-a/metrics?metrics=${all}&window=7d`, key: keyA }, 200)
  await call(t, { method: 'GET', path: '/v1/agents/m-b/metrics', key: acct }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/agents/m-a/metrics?metrics=bogus', key: acct }, 400, 'invalid_request')).body.field, 'metrics')
  await call(t, { method: 'GET', path: '/v1/agents/m-a/metrics', key: keyB }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/agents/nobody/metrics', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: '/v1/metrics?window=1h', key: acct }, 200)
  await call(t, { method: 'GET', path: `/v1/metrics?metrics=${all.replace(',budget_used_pct', '')}&window=30d`, key: acct }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/metrics?window=2y', key: acct }, 400, 'invalid_request')).body.field, 'window')
  await call(t, { method: 'GET', path: '/v1/metrics', key: keyA }, 403, 'forbidden')
})

t.test('bodies over the limit: 413 on every operation of this area that takes one', async (t) => {
  const big = { agentId: 'm-a', pad: 'x'.repeat(MAX_BODY_BYTES + 100) }
  for (const path of AREAS.money) {
    for (const method of contract.methodsOf(path)) {
      if (!contract.doc.paths[path][method.toLowerCase()].requestBody) continue
      await call(t, { method, path: concrete(path), key: acct, body: big, headers: { 'x-agent-id': 'm-a' } }, 413, 'payload_too_large')
    }
  }
})

t.test('401 without a valid key, 405 for an undocumented method, 429 past the rate', async (t) => {
  await sweep401(t, gw, contract, 'money')
  await sweep405(t, gw, contract, 'money')
  await sweep429(t, gw, contract, 'money')
})

t.test('the chain gone: a payment whose funds check cannot read the balance is 503', async (t) => {
  const started = gw.logs.map((l) => JSON.parse(l)).find((j) => j.msg === 'anvil started')
  t.ok(started?.pid, 'the embedded anvil this gateway started')
  process.kill(started.pid, 'SIGKILL')
  const until = Date.now() + 5000
  while (Date.now() < until && (await send(gw.url, { method: 'GET', path: '/readyz' })).status !== 503) await new Promise((r) => setTimeout(r, 50))
  await call(t, { method: 'POST', path: '/v1/pay', key: acct, body: { agentId: 'm-c', endpoint: paid } }, 503, 'unavailable')
})

t.test('coverage: every documented status of this area answered, nothing undocumented seen', async (t) => {
  assertCoverage(t, contract, 'money')
})
