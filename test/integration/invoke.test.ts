import t from 'tap'
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
