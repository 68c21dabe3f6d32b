import t from 'tap'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { gasFundedKey, replicaChain, spawnReplicas } from '../helpers/replica-chain.js'
import { testDir } from '../helpers/gateway.js'
import { type Merchant, startV2Merchant } from '../helpers/merchants.js'
import { call, type GatewayProcess, spawnGateway } from '../helpers/process.js'

// Gateways, a PostgreSQL cluster and a chain on a 2-core machine shared with other tests.
t.setTimeout(600_000)

const CHAIN_ID = 31339
const MASTER_KEY = 'ef'.repeat(32)

/**
 * The metrics API on replicas of one PostgreSQL database: payments made through each replica,
 * and every replica's `/v1/agents/{id}/metrics` and `/v1/metrics` answer the totals over all of
 * them (each replica writes rows of its own; a query sums every replica's from the database).
 * Then one replica is SIGKILLed: its rows still count, on the survivor and on a replica started
 * after it, which adds its own payments to the same totals.
 */
t.test('every replica answers the metrics totals over the payments made through all replicas', async (t) => {
  // A bank minted before the replicas start (the ledger signer's later nonces are theirs) funds the agents.
  const { anvil, addrs, env: shared, fund } = await replicaChain(t, CHAIN_ID, 100_000_000n)
  const env = { ...shared, PAYGATE_MASTER_KEY: MASTER_KEY }
  const start = (dir: string) => spawnGateway({ PAYGATE_DATA_DIR: dir, ...env }, [], [], true, 90_000)
  const { replicas, acct } = await spawnReplicas(t, env, 2, true)
  const [a, b] = replicas as [GatewayProcess, GatewayProcess]

  // Two merchants at different prices, each its own payee.
  const merchant = async (price: bigint): Promise<Merchant> => {
    const facilitatorKey = await gasFundedKey(anvil)
    const m = await startV2Merchant({ chain: { rpcUrl: anvil.url, chainId: CHAIN_ID, token: addrs.token }, facilitatorKey, payTo: privateKeyToAccount(generatePrivateKey()).address, price })
    t.teardown(() => m.close())
    return m
  }
  const cheap = await merchant(1000n) // 0.001 USDC
  const dear = await merchant(2500n) // 0.0025 USDC

  // m1 and m2 pay; m3's per-call limit refuses the dear merchant (recorded rejections).
  for (const [i, agentId] of ['m1', 'm2', 'm3'].entries()) {
    t.equal((await call(replicas[i % 2]!.url, 'POST', '/v1/agents', acct, { agentId })).status, 201)
    const w = await call(replicas[(i + 1) % 2]!.url, 'POST', '/v1/wallets', acct, { agentId })
    t.equal(w.status, 201, w.text)
    await fund(w.body.address, 1_000_000n)
  }
  t.equal((await call(a.url, 'PUT', '/v1/policies/m3', acct, { perCallLimit: { usdc: 0.001 } })).status, 200)

  const expected = { m1: { spend: 0n, n: 0 }, m2: { spend: 0n, n: 0 }, m3: { spend: 0n, n: 0 } }
  const rejected: Record<string, number> = {}
  /** `n` payments of `agentId` to `m` through `g`, concurrently; tallied into the expectation from the answers. */
  async function pay(g: GatewayProcess, agentId: keyof typeof expected, m: Merchant, price: bigint, n: number): Promise<void> {
    const results = await Promise.all(Array.from({ length: n }, () => call(g.url, 'POST', '/v1/pay', acct, { agentId, endpoint: `${m.url}/paid` })))
    for (const r of results) {
      if (r.status === 200) {
        expected[agentId].spend += price
        expected[agentId].n++
      } else {
        t.equal(r.status, 402, r.text)
        rejected[r.body.reason] = (rejected[r.body.reason] ?? 0) + 1
      }
    }
  }
  const usdc = (units: bigint) => Number(units) / 1e6
  const names = 'spend,tx_count,rejected_count,top_endpoints'

  /** What every replica must answer: the agents' and the account's totals so far. */
  async function assertTotals(gs: GatewayProcess[], what: string): Promise<void> {
    const total = Object.values(expected).reduce((s, e) => ({ spend: s.spend + e.spend, n: s.n + e.n }), { spend: 0n, n: 0 })
    const rejectedTotal = Object.values(rejected).reduce((s, n) => s + n, 0)
    for (const [i, g] of gs.entries()) {
      for (const [agentId, e] of Object.entries(expected)) {
        const r = await call(g.url, 'GET', `/v1/agents/${agentId}/metrics?window=1h&metrics=${names}`, acct)
        t.equal(r.status, 200, r.text)
        t.equal(r.body.metrics.spend.total, usdc(e.spend), `${what}: replica ${i} ${agentId} spend`)
        t.equal(r.body.metrics.tx_count, e.n, `${what}: replica ${i} ${agentId} tx_count`)
        const endpoints = (r.body.metrics.top_endpoints as { tx_count: number }[]).reduce((s, x) => s + x.tx_count, 0)
        t.equal(endpoints, e.n, `${what}: replica ${i} ${agentId} top_endpoints add up`)
        if (agentId === 'm3') t.same(r.body.metrics.rejected_count, { total: rejectedTotal, by_reason: rejected }, `${what}: replica ${i} m3 rejections`)
      }
      for (const window of ['1h', '24h', '30d']) {
        const r = await call(g.url, 'GET', `/v1/metrics?window=${window}&metrics=${names}`, acct)
        t.equal(r.status, 200, r.text)
        t.equal(r.body.metrics.spend.total, usdc(total.spend), `${what}: replica ${i} account spend (${window})`)
        t.equal(r.body.metrics.tx_count, total.n, `${what}: replica ${i} account tx_count (${window})`)
        t.same(r.body.metrics.rejected_count, { total: rejectedTotal, by_reason: rejected }, `${what}: replica ${i} account rejections (${window})`)
        const byAgent = Object.fromEntries(
          Object.entries(expected)
            .filter(([, e]) => e.n > 0)
            .map(([id, e]) => [id, { spend: { total: usdc(e.spend) }, tx_count: e.n }]),
        )
        t.same(r.body.by_agent, byAgent, `${what}: replica ${i} by_agent (${window})`)
      }
    }
  }

  // Through both replicas at once: each agent pays through both.
  await Promise.all([
    pay(a, 'm1', cheap, 1000n, 3),
    pay(b, 'm1', dear, 2500n, 2),
    pay(a, 'm2', dear, 2500n, 2),
    pay(b, 'm2', cheap, 1000n, 4),
    pay(a, 'm3', dear, 2500n, 1),
    pay(b, 'm3', dear, 2500n, 2),
  ])
  t.equal(expected.m1.n + expected.m2.n, 11, 'every payment of m1 and m2 was paid')
  t.same(rejected, { per_call_limit_exceeded: 3 }, "m3's calls were refused by its policy")
  await assertTotals([a, b], 'payments through both')

  // A is killed: what it counted stays counted (its rows are summed until a survivor folds them).
  t.equal(await a.stop('SIGKILL'), 'SIGKILL')
  await assertTotals([b], 'after A was killed')
  const c = await start(testDir(t))
  replicas.push(c)
  await assertTotals([b, c], 'a replica started after it')
  await Promise.all([pay(c, 'm1', cheap, 1000n, 2), pay(b, 'm2', dear, 2500n, 1), pay(c, 'm3', dear, 2500n, 1)])
  await assertTotals([b, c], 'payments through the new replica and the survivor')
})
