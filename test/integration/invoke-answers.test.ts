import t from 'tap'
import { createServer, type RequestListener } from 'node:http'
import type { AddressInfo } from 'node:net'
import { startTestGateway } from '../helpers/gateway.js'

/**
 * POST /v1/agents/invoke against sub-agents that answer badly (a broken body, a redirect), the
 * request's own checks, and the methods of its path: what the orchestrator gets back.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
await gw.api('POST', '/v1/agents', { body: { agentId: 'orch' } })
await gw.api('POST', '/v1/wallets', { body: { agentId: 'orch' } })

/** A plain HTTP server on loopback, closed when the test file ends; its URL. */
async function serve(handler: RequestListener): Promise<string> {
  const s = createServer(handler)
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r))
  t.teardown(
    () =>
      new Promise<void>((r) => {
        s.closeAllConnections()
        s.close(() => r())
      }),
  )
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}/task`
}

const invoke = (body: Record<string, unknown>) => gw.api('POST', '/v1/agents/invoke', { headers: { 'x-agent-id': 'orch' }, body })

t.test('a sub-agent that breaks off its answer body: 502 sub_agent_failed with the usual fields, not 500', async (t) => {
  const url = await serve((req, res) => {
    req.resume()
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '1000' })
      res.write('{"output": "the first part')
      setTimeout(() => res.socket?.destroy(), 50)
    })
  })
  const r = await invoke({ agentEndpoint: url, task: {}, budget: { usdc: 0.01 } })
  t.same([r.status, r.body.error, r.body.upstreamStatus], [502, 'sub_agent_failed', 200], r.text)
  t.same([r.body.totalCost, r.body.paymentChain], [{ usdc: 0 }, []])
  t.match(r.body, { invocationId: String, txHash: /^0x[0-9a-f]{64}$/ })
})

t.test('a redirect from the sub-agent is a failure, not followed: 502 with its status', async (t) => {
  let followed = 0
  const elsewhere = await serve((_req, res) => {
    followed++
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"output":"elsewhere"}')
  })
  const url = await serve((req, res) => {
    req.resume()
    req.on('end', () => res.writeHead(302, { location: elsewhere }).end())
  })
  const r = await invoke({ agentEndpoint: url, task: {}, budget: { usdc: 0.01 } })
  t.same([r.status, r.body.error, r.body.upstreamStatus], [502, 'sub_agent_failed', 302], r.text)
  t.notOk('output' in r.body)
  t.equal(followed, 0, 'the Location is not called')
})

t.test('budget: an unknown field inside it is 400 naming it; a bad amount names budget.usdc', async (t) => {
  const endpoint = 'http://127.0.0.1:1/task'
  const cases: [unknown, string][] = [
    [{ usdc: 1, eur: 2 }, 'budget.eur'],
    [{ usdc: -1 }, 'budget.usdc'],
    [{ usdc: 'lots' }, 'budget.usdc'],
    [{}, 'budget.usdc'],
    [1, 'budget'],
  ]
  for (const [budget, field] of cases) {
    const r = await invoke({ agentEndpoint: endpoint, task: {}, budget })
    t.same([r.status, r.body.error, r.body.field], [400, 'invalid_request', field], JSON.stringify(budget))
  }
  t.match((await invoke({ agentEndpoint: endpoint, task: {}, budget: { usdc: 1, eur: 2 } })).body.detail, /budget\.eur/)
})

t.test('/v1/agents/invoke under any other method: 405 with Allow: POST (not agent "invoke")', async (t) => {
  for (const method of ['GET', 'DELETE', 'PUT', 'PATCH']) {
    const r = await gw.api(method, '/v1/agents/invoke')
    t.same([r.status, r.body?.error, r.headers.get('allow')], [405, 'method_not_allowed', 'POST'], method)
  }
  const agent = await gw.api('GET', '/v1/agents/orch')
  t.same([agent.status, agent.body.agentId], [200, 'orch'], 'an agent id in that place is still an agent')
  t.equal((await gw.api('PUT', '/v1/agents/orch')).headers.get('allow'), 'GET, DELETE')
})

t.test("the orchestrator's policy refusing the invocation: 402, and recorded as a rejected transaction with its reason", async (t) => {
  await gw.api('POST', '/v1/agents', { body: { agentId: 'picky-orch' } })
  await gw.api('POST', '/v1/wallets', { body: { agentId: 'picky-orch' } })
  await gw.api('PUT', '/v1/policies/picky-orch', { body: { blockedDomains: ['127.0.0.1'], dailyBudget: { usdc: 1 } } })
  let called = 0
  const url = await serve((_req, res) => {
    called++
    res.end('{"output":"never"}')
  })
  const r = await gw.api('POST', '/v1/agents/invoke', { headers: { 'x-agent-id': 'picky-orch' }, body: { agentEndpoint: url, task: {}, budget: { usdc: 0.5 } } })
  t.same([r.status, r.body.error, r.body.reason], [402, 'policy_violation', 'domain_blocked'], r.text)
  t.equal(called, 0, 'the sub-agent was not called')
  const listed = (await gw.api('GET', '/v1/transactions?agentId=picky-orch&status=rejected')).body.transactions
  t.match(listed, [{ agentId: 'picky-orch', status: 'rejected', reason: 'domain_blocked', endpoint: url, amountPaid: { usdc: 0 } }])
  t.equal(listed.length, 1)
  const m = (await gw.api('GET', '/v1/agents/picky-orch/metrics?metrics=rejected_count,tx_count')).body.metrics
  t.same(m, { rejected_count: { total: 1, by_reason: { domain_blocked: 1 } }, tx_count: 0 })
  t.equal((await gw.api('GET', '/v1/policies/picky-orch')).body.dailyBudget.usedToday, 0, 'nothing held or spent')
})
