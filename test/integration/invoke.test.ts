import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Hex } from 'viem'
import { startTestGateway } from '../helpers/gateway.js'
import { testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { startSubAgent, type SubAgentCall } from '../helpers/sub-agent.js'

/**
 * POST /v1/agents/invoke: sub-agents paying real merchants through POST /v1/pay and the proxy
 * with the invocation's token, under a hard cap, on the real chain.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const { balanceOf, merchantOptions, info, fundedKey } = await testChain(gw)
const merchantOpts = await merchantOptions(10_000n) // 0.01 USDC a call
const m = await startV2Merchant(merchantOpts)
t.teardown(() => m.close())
const paid = `${m.url}/paid`

async function agent(agentId: string): Promise<string> {
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId } })).body.apiKey as string
  await gw.api('POST', '/v1/wallets', { body: { agentId } })
  return key
}
const orchKey = await agent('orch')
const subKey = await agent('sub')
const sub2Key = await agent('sub2')

async function subAgent(agentId: string, key: string, work: (c: SubAgentCall) => Promise<unknown>, price?: bigint) {
  const s = await startSubAgent({
    apiUrl: gw.url,
    proxyUrl: gw.gw.proxyUrl,
    agentId,
    agentKey: key,
    work,
    ...(price ? { price, chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, network: info.network, token: info.token, facilitatorKey: await fundedKey(), payTo: merchantOpts.payTo } } : {}),
  })
  t.teardown(() => s.close())
  return s
}

const invoke = (body: Record<string, unknown>, agentId = 'orch', key: string | undefined = orchKey) => gw.api('POST', '/v1/agents/invoke', { key, headers: { 'x-agent-id': agentId }, body })

t.test('the cap is hit mid-task: the sub-agent sees budget_exceeded, the merchant is paid no more than the cap (on chain)', async (t) => {
  const before = await balanceOf(merchantOpts.payTo as Hex)
  const seen: { via: string; status: number; error?: string }[] = []
  let token = ''
  let rootTx = ''
  const s = await subAgent('sub', subKey, async (c) => {
    token = c.token
    rootTx = c.parentTx
    // Alternate /v1/pay and the proxy until refused.
    for (let i = 0; i < 6; i++) {
      if (i % 2 === 0) {
        const r = await c.pay(paid)
        seen.push({ via: 'api', status: r.status, error: r.body.error })
        if (r.status !== 200) break
      } else {
        const r = await c.proxyGet(paid)
        seen.push({ via: 'proxy', status: r.status, ...(r.error ? { error: r.error } : {}) })
        if (r.status !== 200) break
      }
    }
    return { payments: seen.filter((x) => x.status === 200).length }
  })
  const r = await invoke({ agentEndpoint: s.url, task: { q: 'crawl' }, budget: { usdc: 0.035 }, runId: 'cap-run' })
  t.equal(r.status, 200, r.text)
  t.same(r.body.output, { payments: 3 })
  t.same(r.body.totalCost, { usdc: 0.03 })
  t.equal(r.body.paymentChain.length, 3)
  t.same(seen[3], { via: 'proxy', status: 402, error: 'budget_exceeded' }, 'the 4th payment, through the proxy, is refused by the cap')
  t.equal(s.calls[0]!.budgetRemaining, '0.035', 'X-Paygate-Budget-Remaining')
  t.match(token, /^pgi_[0-9a-f]{64}$/)
  t.equal(rootTx, r.body.txHash, 'X-Paygate-Parent-Tx is the root')
  t.equal((await balanceOf(merchantOpts.payTo as Hex)) - before, 30_000n, 'the merchant settled 0.03 on chain, under the cap')
  const rejected = await gw.api('GET', '/v1/transactions?agentId=sub&status=rejected')
  t.equal(rejected.body.transactions.length, 1)
  t.match(rejected.body.transactions[0], { reason: 'budget_exceeded', parentTxHash: r.body.txHash, depth: 1 })
  const roots = (await gw.api('GET', '/v1/transactions?agentId=orch')).body.transactions
  t.match(roots[0], { kind: 'invocation', status: 'closed', txHash: r.body.txHash, depth: 0, amountPaid: { usdc: 0 } })
  const tree = await gw.api('GET', `/v1/transactions/${r.body.paymentChain[1]}/tree`)
  t.same([tree.body.totalCost, tree.body.txCount, tree.body.root.children.length], [{ usdc: 0.03 }, 3, 3])
  t.notOk('protocol' in tree.body.root || 'endpoint' in tree.body.root)

  // The token died with the answer.
  const late = await gw.api('POST', '/v1/pay', { key: subKey, headers: { 'x-paygate-invocation': token }, body: { agentId: 'sub', endpoint: paid } })
  t.same([late.status, late.body.error], [402, 'budget_exceeded'])
  t.match(late.body.detail, /invocation closed/)
  // The tree grows only with an open token.
  const sneak = await gw.api('POST', '/v1/pay', { key: subKey, body: { agentId: 'sub', endpoint: paid, parentTxHash: r.body.txHash } })
  t.same([sneak.status, sneak.body.error], [402, 'budget_exceeded'])
  // X-Paygate-* inside /v1/pay's headers field is refused.
  const smuggled = await gw.api('POST', '/v1/pay', { key: subKey, body: { agentId: 'sub', endpoint: paid, headers: { 'X-Paygate-Invocation': token } } })
  t.same([smuggled.status, smuggled.body.field], [400, 'headers.X-Paygate-Invocation'])
})

t.test('X-Paygate-Invocation is removed before a proxied request leaves Paygate', async (t) => {
  const seen: (string | undefined)[] = []
  const echo = createServer((req, res) => {
    seen.push(req.headers['x-paygate-invocation'] as string | undefined)
    res.end('ok')
  })
  await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => echo.close(() => r())))
  const target = `http://127.0.0.1:${(echo.address() as AddressInfo).port}/free`
  const s = await subAgent('sub', subKey, async (c) => (await c.proxyGet(target)).status)
  const r = await invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: 0.01 } })
  t.same([r.status, r.body.output], [200, 200], r.text)
  t.same(seen, [undefined], 'the target never sees the token')
  t.equal(typeof s.calls[0]!.token, 'string', 'while the sub-agent got it')
})

t.test('a foreign parent with an open token is 400; a made-up token is budget_exceeded', async (t) => {
  const other = await gw.api('POST', '/v1/pay', { key: subKey, body: { agentId: 'sub', endpoint: paid } })
  t.equal(other.status, 200, other.text)
  const got: Record<string, unknown> = {}
  const s = await subAgent('sub', subKey, async (c) => {
    const foreign = await c.pay(paid, { parentTxHash: other.body.txHash })
    got.foreign = [foreign.status, foreign.body.error, foreign.body.field]
    const madeUp = await c.pay(paid, { token: `pgi_${'0'.repeat(64)}` })
    got.madeUp = [madeUp.status, madeUp.body.error]
    const underRoot = await c.pay(paid, { parentTxHash: c.parentTx })
    got.underRoot = underRoot.status
    return 'done'
  })
  const r = await invoke({ agentEndpoint: s.url, task: 'x', budget: { usdc: 0.05 } })
  t.equal(r.status, 200, r.text)
  t.same(got, { foreign: [400, 'invalid_request', 'parentTxHash'], madeUp: [402, 'budget_exceeded'], underRoot: 200 })
  t.equal(r.body.output, 'done')
})

t.test("the orchestrator pays the sub-agent's own 402 inside a cap equal to its daily budget: counted once", async (t) => {
  await gw.api('PUT', '/v1/policies/orch', { body: { dailyBudget: { usdc: 0.05 } } })
  t.teardown(() => gw.api('PUT', '/v1/policies/orch', { body: { dailyBudget: null } }))
  const usage = (id: string) => gw.gw.policies.usageOf(id)
  const subBefore = BigInt((await usage('sub')).spent)
  let heldDuring: { id: string; amount: string; cap?: true }[] = []
  const s = await subAgent(
    'sub',
    subKey,
    async (c) => {
      heldDuring = (await usage('orch')).holds ?? []
      const r = await c.pay(paid)
      return { ok: r.status === 200 }
    },
    20_000n,
  )
  const r = await invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: 0.05 } })
  t.equal(r.status, 200, r.text)
  t.equal(s.settlements, 1, "the orchestrator's payment settled on chain")
  t.same(r.body.output, { ok: true })
  t.same(r.body.totalCost, { usdc: 0.03 }, "the sub-agent's price and the sub-agent's own payment")
  t.equal(r.body.paymentChain.length, 2)
  // While the sub-agent worked, the orchestrator's payment (in flight) was drawn from the cap hold: 0.05 held in all, not 0.07.
  t.same(heldDuring.map((h) => [h.cap ?? false, h.amount]).sort(), [
    [false, '20000'],
    [true, '30000'],
  ])
  t.same((await gw.api('GET', '/v1/policies/orch')).body.dailyBudget, { usdc: 0.05, usedToday: 0.02 }, 'after the close: its own payment stays counted')
  t.same((await usage('orch')).holds, [], 'and the rest of the cap hold is released')
  t.equal(BigInt((await usage('sub')).spent) - subBefore, 10_000n, "the sub-agent's payment counts in its own usage")
  // 0.02 of 0.05 used: a cap of 0.04 does not fit.
  const over = await invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: 0.04 } })
  t.same([over.status, over.body.error, over.body.reason], [402, 'policy_violation', 'daily_budget_exceeded'])
  // The sub-agent's price over the cap: budget_exceeded, recorded as a rejected payment of the orchestrator.
  const cheap = await invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: 0.01 } })
  t.same([cheap.status, cheap.body.error], [402, 'budget_exceeded'])
  t.same(cheap.body.totalCost, { usdc: 0 })
  const rej = (await gw.api('GET', '/v1/transactions?agentId=orch&status=rejected')).body.transactions
  t.match(rej[0], { reason: 'budget_exceeded', depth: 1, parentTxHash: cheap.body.txHash })
})

t.test('a refused invocation does not make the next decision forget a cap hold still on its way to the store', async (t) => {
  // The outbox writes an opening (its cap hold among it) once its group is signed: hold the signing back.
  await gw.api('PUT', '/v1/policies/orch', { body: { dailyBudget: { usdc: 0.1 } } })
  t.teardown(() => gw.api('PUT', '/v1/policies/orch', { body: { dailyBudget: null } }))
  const used = (await gw.api('GET', '/v1/policies/orch')).body.dailyBudget.usedToday as number
  const s = await subAgent('sub', subKey, async () => 'done')
  const writer = (gw.gw.outbox as unknown as { writer: { signMany(items: unknown[]): Promise<unknown[]> } }).writer
  const signMany = writer.signMany.bind(writer)
  let release!: () => void
  const held = new Promise<void>((r) => (release = r))
  let asked = 0
  writer.signMany = async (items) => {
    asked++
    await held
    return signMany(items)
  }
  t.teardown(() => {
    release()
    writer.signMany = signMany
  })
  const cap = Math.floor(((0.1 - used) * 1e6 * 3) / 5) / 1e6 // 60% of what is left: one fits, two do not
  const first = invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: cap } })
  for (let i = 0; i < 200 && asked === 0; i++) await new Promise((r) => setTimeout(r, 10))
  t.equal(asked, 1, "the first opening waits for its group's signature, its cap hold not yet in the store")
  const over = await invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: 0.1 } })
  t.same([over.status, over.body.reason], [402, 'daily_budget_exceeded'], 'an invocation over the budget is refused')
  const second = invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: cap } })
  await new Promise((r) => setTimeout(r, 100))
  release()
  const [a, b] = await Promise.all([first, second])
  t.equal(a.status, 200, a.text)
  t.same([b.status, b.body.reason], [402, 'daily_budget_exceeded'], "the second cap is decided with the first one's hold: refused")
  t.same((await gw.gw.policies.usageOf('orch')).holds, [], 'no hold left once the first invocation closed')
})

t.test('fan-out: 5 concurrent invocations against one daily budget, exactly 3 caps fit', async (t) => {
  await gw.api('PUT', '/v1/policies/orch', { body: { dailyBudget: { usdc: 0.1 } } })
  t.teardown(() => gw.api('PUT', '/v1/policies/orch', { body: { dailyBudget: null } }))
  const used = (await gw.api('GET', '/v1/policies/orch')).body.dailyBudget.usedToday as number
  let open!: () => void
  const gate = new Promise<void>((r) => (open = r))
  let arrived = 0
  const s = await subAgent('sub', subKey, async (c) => {
    if (++arrived === 5) open()
    await gate
    const r = await c.pay(paid)
    return r.status
  })
  // Caps of (0.1 - used) / 3, rounded down to a base unit: three fit, a fourth does not.
  const capUnits = Math.floor(((0.1 - used) * 1e6) / 3)
  let answered = 0
  const calls = Array.from({ length: 5 }, (_, i) =>
    invoke({ agentEndpoint: s.url, task: { i }, budget: { usdc: capUnits / 1e6 }, runId: 'fan' }).then((r) => {
      if (r.status !== 200 && ++answered === 2) open()
      return r
    }),
  )
  const rs = await Promise.all(calls)
  const ok = rs.filter((r) => r.status === 200)
  const refused = rs.filter((r) => r.status !== 200)
  t.equal(ok.length, 3)
  t.same(
    refused.map((r) => [r.status, r.body.reason]),
    [
      [402, 'daily_budget_exceeded'],
      [402, 'daily_budget_exceeded'],
    ],
  )
  t.same(
    ok.map((r) => r.body.output),
    [200, 200, 200],
  )
  const run = await gw.api('GET', '/v1/runs/fan?agentId=orch')
  t.equal(run.status, 200, run.text)
  t.same([run.body.invocations.length, run.body.totalCost, run.body.txCount], [3, { usdc: 0.03 }, 3])
  t.ok(run.body.invocations.every((i: { status: string }) => i.status === 'closed'))
  t.match((await gw.api('GET', '/v1/policies/orch')).body.dailyBudget, { usedToday: used }, "the sub-agents' payments are not the orchestrator's spend")
})

t.test('a 3-step pipeline passes outputs along; the run adds them up', async (t) => {
  const s = await subAgent('sub', subKey, async (c) => {
    const r = await c.pay(paid)
    if (r.status !== 200) throw new Error(r.body.error)
    return { n: ((c.task as { n: number }).n ?? 0) + 1 }
  })
  let task: unknown = { n: 0 }
  for (let i = 0; i < 3; i++) {
    const r = await invoke({ agentEndpoint: s.url, task, budget: { usdc: 0.01 }, runId: 'pipe' })
    t.equal(r.status, 200, r.text)
    task = r.body.output
  }
  t.same(task, { n: 3 })
  const run = await gw.api('GET', '/v1/runs/pipe?agentId=orch')
  t.same([run.body.invocations.length, run.body.totalCost, run.body.txCount], [3, { usdc: 0.03 }, 3])
  const runs = await gw.api('GET', '/v1/runs?agentId=orch&limit=2')
  t.same(
    runs.body.runs.map((r: { runId: string }) => r.runId),
    ['cap-run', 'fan'],
  )
  const next = await gw.api('GET', `/v1/runs?agentId=orch&limit=2&cursor=${runs.body.nextCursor}`)
  t.same(
    next.body.runs.map((r: { runId: string }) => r.runId),
    ['pipe'],
  )
  t.equal(next.body.nextCursor, null)
  t.equal((await gw.api('GET', '/v1/runs?agentId=orch', { key: subKey })).status, 403, "another agent's key")
  t.equal((await gw.api('GET', '/v1/runs/nope?agentId=orch')).status, 404)
})

t.test('nesting two levels deep: caps carved from the parent; chain and tree from the root, a middle node and a leaf', async (t) => {
  const inner = await subAgent('sub2', sub2Key, async (c) => {
    const codes = []
    for (let i = 0; i < 3; i++) codes.push((await c.pay(paid)).status)
    return codes
  })
  const nested: Record<string, unknown> = {}
  const outer = await subAgent('sub', subKey, async (c) => {
    const own = await c.pay(paid)
    const tooBig = await c.invoke({ agentEndpoint: inner.url, task: 'too big', budget: { usdc: 0.1 } })
    nested.tooBig = [tooBig.status, tooBig.body.error]
    const r = await c.invoke({ agentEndpoint: inner.url, task: 'go', budget: { usdc: 0.02 } })
    nested.answer = r.body
    return { own: own.status, inner: r.body.output }
  })
  const r = await invoke({ agentEndpoint: outer.url, task: {}, budget: { usdc: 0.05 } })
  t.equal(r.status, 200, r.text)
  t.same(r.body.output, { own: 200, inner: [200, 200, 402] }, 'the inner cap of 0.02 stops its third payment')
  t.same(nested.tooBig, [402, 'budget_exceeded'], 'a nested cap over what is left of the parent')
  t.match(nested.answer, { totalCost: { usdc: 0.02 } })
  t.same(r.body.totalCost, { usdc: 0.03 })
  t.equal(r.body.paymentChain.length, 3)
  const innerRoot = (nested.answer as { txHash: string }).txHash
  const leaf = (nested.answer as { paymentChain: string[] }).paymentChain[0]!
  const chain = await gw.api('GET', `/v1/transactions/${leaf}/chain`)
  t.same(
    chain.body.chain.map((n: { txHash: string; agentId: string; depth: number }) => [n.txHash, n.agentId, n.depth]),
    [
      [r.body.txHash, 'orch', 0],
      [innerRoot, 'sub', 1],
      [leaf, 'sub2', 2],
    ],
  )
  t.notOk('protocol' in chain.body.chain[1], 'an invocation root has no protocol')
  t.match(chain.body.chain[2], { protocol: 'x402', endpoint: paid, amountPaid: { usdc: 0.01 } })
  const trees = await Promise.all([r.body.txHash, innerRoot, leaf].map((h) => gw.api('GET', `/v1/transactions/${h}/tree`)))
  for (const tr of trees) {
    t.equal(tr.status, 200)
    t.same(tr.body, trees[0]!.body, 'the same tree from any node')
  }
  const tree = trees[0]!.body
  t.same([tree.totalCost, tree.txCount], [{ usdc: 0.03 }, 3])
  t.match(tree.root, { txHash: r.body.txHash, agentId: 'orch', amountPaid: { usdc: 0 }, depth: 0, status: 'closed' })
  const kids = tree.root.children as { agentId: string; status: string; children: unknown[] }[]
  t.same(kids.map((k) => [k.agentId, k.status, k.children.length]).sort(), [
    ['sub', 'closed', 2],
    ['sub', 'paid', 0],
  ])
  // sub2 is in the tree: its key reads it; a stranger's does not.
  t.equal((await gw.api('GET', `/v1/transactions/${r.body.txHash}/tree`, { key: sub2Key })).status, 200)
})

t.test('invoke input: 400 naming the field, 404 for an unknown orchestrator, 403 for another agent key', async (t) => {
  const cases: [Record<string, unknown>, Record<string, string>, string][] = [
    [{ task: 1, budget: { usdc: 1 } }, {}, 'agentEndpoint'],
    [{ agentEndpoint: 'ftp://x', task: 1, budget: { usdc: 1 } }, {}, 'agentEndpoint'],
    [{ agentEndpoint: 'http://127.0.0.1:1/', budget: { usdc: 1 } }, {}, 'task'],
    [{ agentEndpoint: 'http://127.0.0.1:1/', task: 1, budget: { usdc: -1 } }, {}, 'budget.usdc'],
    [{ agentEndpoint: 'http://127.0.0.1:1/', task: 1, budget: { usdc: 1 }, runId: 'bad id' }, {}, 'runId'],
  ]
  for (const [body, , field] of cases) {
    const r = await invoke(body)
    t.same([r.status, r.body.field], [400, field], field)
  }
  const noHeader = await gw.api('POST', '/v1/agents/invoke', { body: { agentEndpoint: 'http://127.0.0.1:1/', task: 1, budget: { usdc: 1 } } })
  t.same([noHeader.status, noHeader.body.field], [400, 'X-Agent-Id'])
  const ghost = await invoke({ agentEndpoint: 'http://127.0.0.1:1/', task: 1, budget: { usdc: 1 } }, 'ghost', gw.accountKey)
  t.equal(ghost.status, 404)
  const foreignKey = await invoke({ agentEndpoint: 'http://127.0.0.1:1/', task: 1, budget: { usdc: 1 } }, 'orch', subKey)
  t.equal(foreignKey.status, 403)
})

t.test('the sub-agent failing: 502 sub_agent_failed with what it spent; unreachable: 502', async (t) => {
  const s = await subAgent('sub', subKey, async (c) => {
    await c.pay(paid)
    throw new Error('boom')
  })
  const r = await invoke({ agentEndpoint: s.url, task: {}, budget: { usdc: 0.05 } })
  t.same([r.status, r.body.error, r.body.upstreamStatus, r.body.totalCost], [502, 'sub_agent_failed', 500, { usdc: 0.01 }])
  t.equal(r.body.paymentChain.length, 1)
  const gone = await invoke({ agentEndpoint: 'http://127.0.0.1:1/task', task: {}, budget: { usdc: 0.05 } })
  t.same([gone.status, gone.body.error, gone.body.upstreamStatus], [502, 'sub_agent_failed', null])
})

t.test('idempotencyKey: a retried invoke returns the first answer and pays nothing again', async (t) => {
  const s = await subAgent('sub', subKey, async (c) => (await c.pay(paid)).status)
  const body = { agentEndpoint: s.url, task: { k: 1 }, budget: { usdc: 0.02 }, idempotencyKey: 'once' }
  const a = await invoke(body)
  const b = await invoke(body)
  t.equal(a.status, 200, a.text)
  t.same(b.body, a.body)
  t.equal(s.calls.length, 1, 'the sub-agent was called once')
  const c = await invoke({ ...body, task: { k: 2 } })
  t.same([c.status, c.body.error], [409, 'idempotency_conflict'])
})
