import t from 'tap'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { testDir } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { call, spawnGateway } from '../helpers/process.js'
import { startSubAgent } from '../helpers/sub-agent.js'

/**
 * SIGKILL mid-invocation: the sub-agent has paid a merchant with the token and is still working
 * when the gateway dies. After the restart the invocation is `interrupted`, its token is dead,
 * the orchestrator's cap hold is released, and the tree holds the payment that was made.
 */
t.test('an invocation cut off by SIGKILL is interrupted at the next start; its hold is released', async (t) => {
  const dataDir = testDir(t)
  const env = { PAYGATE_DATA_DIR: dataDir }
  const first = await spawnGateway(env)
  t.teardown(() => first.stop('SIGKILL'))
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const info = (await call(first.url, 'GET', '/v1/chain', acct)).body
  const facilitatorKey = generatePrivateKey()
  await fetch(info.rpcUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'anvil_setBalance', params: [privateKeyToAccount(facilitatorKey).address, '0x56bc75e2d63100000'] }),
  })
  const m = await startV2Merchant({
    chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token },
    facilitatorKey,
    payTo: privateKeyToAccount(generatePrivateKey()).address,
    price: 10_000n,
  })
  t.teardown(() => m.close())

  for (const agentId of ['orch', 'sub']) {
    await call(first.url, 'POST', '/v1/agents', acct, { agentId })
    await call(first.url, 'POST', '/v1/wallets', acct, { agentId })
  }
  await call(first.url, 'PUT', '/v1/policies/orch', acct, { dailyBudget: { usdc: 1 } })
  let token = ''
  let paidOnce!: () => void
  const paid = new Promise<void>((r) => (paidOnce = r))
  // The sub-agent pays once, then never answers (until the test ends).
  const hanging = await startSubAgent({
    apiUrl: first.url,
    proxyUrl: 'http://127.0.0.1:1',
    agentId: 'sub',
    agentKey: acct,
    async work(c) {
      token = c.token
      const r = await c.pay(`${m.url}/paid`)
      if (r.status === 200) paidOnce()
      return new Promise(() => {})
    },
  })
  t.teardown(() => hanging.close())
  const cut = fetch(`${first.url}/v1/agents/invoke`, {
    method: 'POST',
    headers: { authorization: `Bearer ${acct}`, 'content-type': 'application/json', 'x-agent-id': 'orch' },
    body: JSON.stringify({ agentEndpoint: hanging.url, task: 'long', budget: { usdc: 0.5 }, runId: 'crash-run' }),
  }).catch(() => null)
  await paid
  t.equal(await first.stop('SIGKILL'), 'SIGKILL')
  await cut

  // The next start waits 1 s at most for a sub-agent's answer.
  const second = await spawnGateway({ ...env, PAYGATE_INVOKE_TIMEOUT_MS: '1000' })
  t.teardown(() => second.stop('SIGKILL'))
  t.ok(
    second.stdout.some((l) => l.includes('interrupted')),
    'the start logs the interrupted invocation',
  )
  const run = (await call(second.url, 'GET', '/v1/runs/crash-run?agentId=orch', acct)).body
  t.equal(run.invocations.length, 1)
  const inv = run.invocations[0]
  t.match(inv, { status: 'interrupted', totalCost: { usdc: 0.01 }, budget: { usdc: 0.5 } })
  t.equal(inv.paymentChain.length, 1)
  const roots = (await call(second.url, 'GET', '/v1/transactions?agentId=orch', acct)).body.transactions
  t.match(roots[0], { kind: 'invocation', status: 'interrupted', txHash: inv.txHash })
  const tree = (await call(second.url, 'GET', `/v1/transactions/${inv.txHash}/tree`, acct)).body
  t.match(tree, { totalCost: { usdc: 0.01 }, txCount: 1, root: { status: 'interrupted', children: [{ agentId: 'sub', status: 'paid', txHash: inv.paymentChain[0] }] } })
  // The token died with the process.
  const late = await fetch(`${second.url}/v1/pay`, {
    method: 'POST',
    headers: { authorization: `Bearer ${acct}`, 'content-type': 'application/json', 'x-paygate-invocation': token },
    body: JSON.stringify({ agentId: 'sub', endpoint: `${m.url}/paid` }),
  })
  t.same([late.status, ((await late.json()) as { error: string }).error], [402, 'budget_exceeded'])
  // The 0.5 cap hold is gone: a cap of the whole daily budget fits again.
  const quick = await startSubAgent({ apiUrl: second.url, proxyUrl: 'http://127.0.0.1:1', agentId: 'sub', agentKey: acct, work: async () => 'fine' })
  t.teardown(() => quick.close())
  const whole = await fetch(`${second.url}/v1/agents/invoke`, {
    method: 'POST',
    headers: { authorization: `Bearer ${acct}`, 'content-type': 'application/json', 'x-agent-id': 'orch' },
    body: JSON.stringify({ agentEndpoint: quick.url, task: 'short', budget: { usdc: 1 } }),
  })
  const body = (await whole.json()) as { output: unknown }
  t.same([whole.status, body.output], [200, 'fine'])
  // A sub-agent that does not answer within invoke.timeoutMs: 504 sub_agent_failed.
  const slow = await startSubAgent({ apiUrl: second.url, proxyUrl: 'http://127.0.0.1:1', agentId: 'sub', agentKey: acct, work: () => new Promise(() => {}) })
  t.teardown(() => slow.close())
  const late504 = await fetch(`${second.url}/v1/agents/invoke`, {
    method: 'POST',
    headers: { authorization: `Bearer ${acct}`, 'content-type': 'application/json', 'x-agent-id': 'orch' },
    body: JSON.stringify({ agentEndpoint: slow.url, task: 'slow', budget: { usdc: 0.1 } }),
  })
  const lateBody = (await late504.json()) as { error: string; upstreamStatus: unknown; totalCost: unknown }
  t.same([late504.status, lateBody.error, lateBody.upstreamStatus, lateBody.totalCost], [504, 'sub_agent_failed', null, { usdc: 0 }])
})

t.test('SIGTERM while an invocation waits on its sub-agent: the gateway exits after its grace, not when the sub-agent answers', async (t) => {
  const dataDir = testDir(t)
  // invoke.timeoutMs at its default (120 s): a shutdown that waited for the sub-agent would be cut by stop() (SIGKILL after 15 s).
  const gw = await spawnGateway({ PAYGATE_DATA_DIR: dataDir, PAYGATE_SHUTDOWN_GRACE_MS: '500' })
  t.teardown(() => gw.stop('SIGKILL'))
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  await call(gw.url, 'POST', '/v1/agents', acct, { agentId: 'orch' })
  await call(gw.url, 'POST', '/v1/wallets', acct, { agentId: 'orch' })
  let received!: () => void
  const got = new Promise<void>((r) => (received = r))
  const silent = createServer((req) => {
    req.resume()
    received()
  })
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    silent.closeAllConnections()
    silent.close()
  })
  const url = `http://127.0.0.1:${(silent.address() as AddressInfo).port}/task`
  const invoking = fetch(`${gw.url}/v1/agents/invoke`, {
    method: 'POST',
    headers: { authorization: `Bearer ${acct}`, 'content-type': 'application/json', 'x-agent-id': 'orch' },
    body: JSON.stringify({ agentEndpoint: url, task: 'wait', budget: { usdc: 0.1 } }),
  }).catch(() => null)
  await got
  t.equal(await gw.stop('SIGTERM'), 0, 'exited by itself, with 0, while the sub-agent still had not answered')
  await invoking
})
