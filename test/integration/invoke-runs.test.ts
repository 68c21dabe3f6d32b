import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { startSubAgent, type SubAgentCall } from '../helpers/sub-agent.js'

/**
 * Runs and invocations as read after the fact (GET /v1/runs, /v1/runs/<runId>), and
 * invoke.timeoutMs: a payment still in flight when an invocation times out counts once it
 * settles; a run keeps the createdAt of its first invocation.
 */
const TIMEOUT_MS = 1500
const gw = await startTestGateway({ overrides: (c) => void (c.invoke.timeoutMs = TIMEOUT_MS) })
t.teardown(() => gw.close())
const { merchantOptions } = await testChain(gw)
const m = await startV2Merchant(await merchantOptions(10_000n))
t.teardown(() => m.close())
const paid = `${m.url}/paid`

async function agent(agentId: string): Promise<string> {
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId } })).body.apiKey as string
  await gw.api('POST', '/v1/wallets', { body: { agentId } })
  return key
}
await agent('orch')
const subKey = await agent('sub')

async function subAgent(work: (c: SubAgentCall) => Promise<unknown>) {
  const s = await startSubAgent({ apiUrl: gw.url, proxyUrl: gw.gw.proxyUrl, agentId: 'sub', agentKey: subKey, work })
  t.teardown(() => s.close())
  return s
}
const invoke = (body: Record<string, unknown>) => gw.api('POST', '/v1/agents/invoke', { headers: { 'x-agent-id': 'orch' }, body })

t.test('a payment in flight when the invocation times out counts in the run once it settles, as in the tree', async (t) => {
  let late!: Promise<{ status: number; body: any }>
  const s = await subAgent(async (c) => {
    await c.pay(paid)
    // The merchant settles the next payment, then holds its answer past invoke.timeoutMs.
    m.setFaults({ hangOnceMs: TIMEOUT_MS + 1500 })
    late = c.pay(paid)
    return (await late).status
  })
  t.teardown(() => m.setFaults({}))
  const r = await invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: 0.05 }, runId: 'late' })
  t.same([r.status, r.body.error, r.body.totalCost, r.body.pendingCost], [504, 'sub_agent_failed', { usdc: 0.01 }, { usdc: 0.01 }], r.text)
  const during = (await gw.api('GET', '/v1/runs/late?agentId=orch')).body
  t.same([during.totalCost, during.txCount, during.invocations[0].pendingCost], [{ usdc: 0.01 }, 1, { usdc: 0.01 }], 'while it is in flight: pending')

  const settled = await late
  t.equal(settled.status, 200, 'the late payment was paid')
  const tree = (await gw.api('GET', `/v1/transactions/${r.body.txHash}/tree`)).body
  t.same([tree.totalCost, tree.txCount], [{ usdc: 0.02 }, 2])
  const run = (await gw.api('GET', '/v1/runs/late?agentId=orch')).body
  t.same([run.totalCost, run.txCount], [tree.totalCost, tree.txCount], "the run's totals are the tree's")
  const inv = run.invocations[0]
  t.same([inv.status, inv.totalCost, inv.paymentChain, 'pendingCost' in inv], ['closed', { usdc: 0.02 }, [...r.body.paymentChain, settled.body.txHash], false])
})

t.test("a run keeps its first invocation's createdAt", async (t) => {
  const s = await subAgent(async () => 'done')
  for (let i = 0; i < 2; i++) {
    t.equal((await invoke({ agentEndpoint: s.url, task: { i }, budget: { usdc: 0.01 }, runId: 'first' })).status, 200)
    await new Promise((r) => setTimeout(r, 20))
  }
  const invs = (await gw.api('GET', '/v1/runs/first?agentId=orch')).body.invocations as { createdAt: string }[]
  t.not(invs[0]!.createdAt, invs[1]!.createdAt)
  const listed = (await gw.api('GET', '/v1/runs?agentId=orch')).body.runs.find((r: { runId: string }) => r.runId === 'first')
  t.equal(listed.createdAt, invs[0]!.createdAt)
})

t.test('invoke.timeoutMs bounds the whole body, not each chunk: a body trickling in is cut off (504)', async (t) => {
  const timers = new Set<NodeJS.Timeout>()
  const drip = createServer((req, res) => {
    req.resume()
    res.writeHead(200, { 'content-type': 'text/plain' })
    // A chunk every 200 ms: each well within the limit, the whole never done.
    const timer = setInterval(() => res.write('.'), 200)
    timers.add(timer)
    res.on('close', () => clearInterval(timer))
  })
  await new Promise<void>((r) => drip.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    for (const timer of timers) clearInterval(timer)
    drip.closeAllConnections()
    drip.close()
  })
  const started = Date.now()
  const r = await invoke({ agentEndpoint: `http://127.0.0.1:${(drip.address() as AddressInfo).port}/task`, task: {}, budget: { usdc: 0.01 } })
  t.same([r.status, r.body.error], [504, 'sub_agent_failed'], r.text)
  t.ok(Date.now() - started < TIMEOUT_MS * 3, 'cut off after about invoke.timeoutMs')
})
