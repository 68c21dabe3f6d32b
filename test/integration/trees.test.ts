import t from 'tap'
import { startTestGateway, tempDir, testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * Cost chains and trees from any node: payments linked by parentTxHash, read through the
 * parent index. A tree of one agent's payments: root -> (a -> a1), b, and a rejected call
 * under the root, which moved no money and is not a node.
 */
const dataDir = tempDir()
let gw = await startTestGateway({ dataDir })
t.teardown(() => gw.close())
const { merchantOptions } = await testChain(gw)
const m = await startV2Merchant(await merchantOptions(10_000n))
t.teardown(() => m.close())

const ownerKey = (await gw.api('POST', '/v1/agents', { body: { agentId: 'orch' } })).body.apiKey as string
await gw.api('POST', '/v1/wallets', { body: { agentId: 'orch' } })
const otherKey = (await gw.api('POST', '/v1/agents', { body: { agentId: 'stranger' } })).body.apiKey as string

async function pay(parentTxHash?: string, path = '/paid'): Promise<string> {
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'orch', endpoint: `${m.url}${path}`, ...(parentTxHash ? { parentTxHash } : {}) } })
  if (r.status !== 200) throw new Error(`setup payment failed: ${r.text}`)
  return r.body.txHash as string
}
const root = await pay()
const a = await pay(root)
const a1 = await pay(a)
const b = await pay(root)
await gw.api('PUT', '/v1/policies/orch', { body: { perCallLimit: { usdc: 0.001 } } })
const refused = await gw.api('POST', '/v1/pay', { body: { agentId: 'orch', endpoint: `${m.url}/paid`, parentTxHash: root } })
if (refused.status !== 402) throw new Error(`the setup's rejection was not one: ${refused.text}`)

const leaf = (h: string) => ({ txHash: h, agentId: 'orch', amountPaid: { usdc: 0.01 }, protocol: 'x402', endpoint: `${m.url}/paid`, status: 'paid' })

t.test('the chain from a leaf: root first, no protocol or endpoint on the depth-0 node', async (t) => {
  const r = await gw.api('GET', `/v1/transactions/${a1}/chain`)
  t.equal(r.status, 200, r.text)
  t.equal(r.body.root, root)
  t.same(
    r.body.chain.map((n: { txHash: string; depth: number }) => [n.txHash, n.depth]),
    [
      [root, 0],
      [a, 1],
      [a1, 2],
    ],
  )
  t.same(r.body.chain[0], { txHash: root, agentId: 'orch', amountPaid: { usdc: 0.01 }, depth: 0 })
  t.match(r.body.chain[2], { protocol: 'x402', endpoint: `${m.url}/paid` })
})

t.test('the same tree from the root, a middle node and a leaf', async (t) => {
  const want = {
    root: {
      txHash: root,
      agentId: 'orch',
      amountPaid: { usdc: 0.01 },
      depth: 0,
      status: 'paid',
      children: [
        { ...leaf(a), depth: 1, children: [{ ...leaf(a1), depth: 2, children: [] }] },
        { ...leaf(b), depth: 1, children: [] },
      ],
    },
    totalCost: { usdc: 0.04 },
    txCount: 3,
  }
  for (const from of [root, a, a1]) {
    const r = await gw.api('GET', `/v1/transactions/${from}/tree`)
    t.equal(r.status, 200, r.text)
    t.same(r.body, want, `from ${from === root ? 'the root' : from === a ? 'a middle node' : 'a leaf'}`)
    t.notOk('protocol' in r.body.root || 'endpoint' in r.body.root, 'none on the depth-0 node')
  }
})

t.test('an agent key reads a tree only if its agent is in it; unknown nodes are 404', async (t) => {
  t.equal((await gw.api('GET', `/v1/transactions/${a}/tree`, { key: ownerKey })).status, 200)
  const other = await gw.api('GET', `/v1/transactions/${a}/tree`, { key: otherKey })
  t.same([other.status, other.body.error], [403, 'forbidden'])
  t.same([(await gw.api('GET', `/v1/transactions/${a}/chain`, { key: otherKey })).status], [403])
  t.equal((await gw.api('GET', `/v1/transactions/0x${'0'.repeat(64)}/tree`)).status, 404)
})

t.test('a rejected payment is no node: its chain and tree are 404, not a root of null', async (t) => {
  const listed = await gw.api('GET', '/v1/transactions?agentId=orch&status=rejected')
  const id = listed.body.transactions[0]?.id as string
  t.ok(id, listed.text)
  for (const what of ['chain', 'tree']) {
    const r = await gw.api('GET', `/v1/transactions/${id}/${what}`)
    t.same([r.status, r.body.error], [404, 'not_found'], `${what}: ${r.text}`)
  }
})

t.test('a store whose records predate the parent index gets it built at start', async (t) => {
  const meta = gw.gw.store.collection('meta')
  const byParent = gw.gw.store.collection('txByParent')
  const keys: string[] = []
  for await (const k of byParent.keys()) keys.push(k)
  t.equal(keys.length, 4, 'four children indexed (the rejected one too)')
  await gw.gw.store.batch([...keys.map((key) => ({ type: 'del' as const, coll: byParent, key })), { type: 'del', coll: meta, key: 'txByParent' }])
  await gw.close({ keepData: true })
  gw = await startTestGateway({ dataDir })
  t.ok(
    gw.logs.some((l) => l.includes('indexed transactions by parent') && l.includes('"entries":4')),
    'built once at start',
  )
  const r = await gw.api('GET', `/v1/transactions/${a1}/tree`)
  t.equal(r.body.txCount, 3, r.text)
})
