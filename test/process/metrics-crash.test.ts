import t from 'tap'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { Transactions } from '../../src/ledger/transactions.js'
import { AGGREGATES_META_KEY, Aggregates, recount } from '../../src/metrics/aggregates.js'
import { Store } from '../../src/store/index.js'
import { systemClock } from '../../src/util/clock.js'
import { testDir } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { call, spawnGateway } from '../helpers/process.js'

/** The stored aggregates and a recount from the stored records, read with the gateway stopped. */
async function storedAndRecounted(dataDir: string): Promise<{ stored: Map<string, string>; recounted: Map<string, string>; records: number }> {
  const store = await Store.open(dataDir)
  try {
    const transactions = new Transactions(store)
    const meta = store.collection<unknown>('meta')
    const aggregates = new Aggregates(store, systemClock)
    const loaded = await aggregates.start(transactions, meta)
    if (loaded.backfilled !== null) throw new Error('the store had no aggregates')
    let records = 0
    for await (const _ of transactions.records.keys()) records++
    return { stored: await aggregates.snapshot(), recounted: await recount(store, transactions, systemClock), records }
  } finally {
    await store.close()
  }
}

/**
 * k1's metrics and its paid records as listed, read until a second metrics read agrees with the
 * first: after a restart the reconciler may still record a payment in flight at the kill as paid
 * (its authorization found used on chain), between any two reads.
 */
async function k1Settled(url: string, acct: string): Promise<{ metrics: { tx_count: number; spend: { total: number } }; paid: { amountPaid: { usdc: number } }[] }> {
  for (let i = 0; ; i++) {
    const metrics = (await call(url, 'GET', '/v1/agents/k1/metrics?metrics=tx_count,spend', acct)).body.metrics
    const paid = (await call(url, 'GET', '/v1/transactions?agentId=k1&status=paid&limit=1000', acct)).body.transactions
    const again = (await call(url, 'GET', '/v1/agents/k1/metrics?metrics=tx_count,spend', acct)).body.metrics
    if (JSON.stringify(again) === JSON.stringify(metrics) || i === 20) return { metrics, paid }
    await new Promise((r) => setTimeout(r, 250))
  }
}

t.test('SIGKILL during paid traffic: the aggregates equal a recount; a store without them is backfilled at start', async (t) => {
  const dataDir = testDir(t)
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => first.stop('SIGKILL'))
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const info = (await call(first.url, 'GET', '/v1/chain', acct)).body
  const facilitatorKey = generatePrivateKey()
  await fetch(info.rpcUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'anvil_setBalance', params: [privateKeyToAccount(facilitatorKey).address, '0x56bc75e2d63100000'] }),
  })
  const m = await startV2Merchant({ chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token }, facilitatorKey, payTo: privateKeyToAccount(generatePrivateKey()).address, price: 1000n })
  t.teardown(() => m.close())
  for (const id of ['k1', 'k2']) {
    await call(first.url, 'POST', '/v1/agents', acct, { agentId: id })
    await call(first.url, 'POST', '/v1/wallets', acct, { agentId: id })
  }
  await call(first.url, 'PUT', '/v1/policies/k2', acct, { perCallLimit: { usdc: 0.0001 } })
  const settled = await Promise.all(Array.from({ length: 6 }, (_, i) => call(first.url, 'POST', '/v1/pay', acct, { agentId: i % 2 ? 'k1' : 'k2', endpoint: `${m.url}/paid` })))
  t.same(settled.map((r) => r.status).sort(), [200, 200, 200, 402, 402, 402])
  // More payments in flight when the process is killed: some written, some not, none half.
  const inFlight = Array.from({ length: 16 }, (_, i) => call(first.url, 'POST', '/v1/pay', acct, { agentId: i % 4 ? 'k1' : 'k2', endpoint: `${m.url}/paid` }).catch(() => null))
  await new Promise((r) => setTimeout(r, 150))
  t.equal(await first.stop('SIGKILL'), 'SIGKILL')
  await Promise.all(inFlight)

  // A restart (the chain and the write-ahead log recovered), then stopped cleanly to read its store.
  const second = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => second.stop('SIGKILL'))
  const { metrics: api, paid: paidList } = await k1Settled(second.url, acct)
  const paid = paidList.length
  t.equal(api.tx_count, paid, 'the API counts every paid record')
  const allPaid = (await call(second.url, 'GET', '/v1/transactions?status=paid&limit=1000', acct)).body.transactions.length
  const account = (await call(second.url, 'GET', '/v1/metrics?metrics=tx_count', acct)).body
  t.equal(account.metrics.tx_count, allPaid, "the account's buckets count every paid record too")
  t.equal(account.by_agent.k1.tx_count, paid)
  t.equal(await second.stop('SIGTERM'), 0)
  const { stored, recounted, records } = await storedAndRecounted(dataDir)
  t.ok(records >= 6)
  t.ok(stored.size > 0)
  t.ok(
    [...stored.keys()].some((k) => k.startsWith('account:')),
    "the account's buckets are stored and compared too",
  )
  t.same([...stored].sort(), [...recounted].sort(), 'the stored aggregates equal a recount from the records')

  // A store with records and no aggregates (as before the metrics): built at start.
  const store = await Store.open(dataDir)
  const agg = store.collection<unknown>('metricsAgg')
  const ops: { type: 'del'; coll: typeof agg; key: string }[] = []
  for await (const key of agg.keys()) ops.push({ type: 'del', coll: agg, key })
  await store.batch([...ops, { type: 'del', coll: store.collection<unknown>('meta'), key: AGGREGATES_META_KEY }])
  await store.close()
  const third = await spawnGateway({ PAYGATE_DATA_DIR: dataDir, PAYGATE_METRICS_REQUIRE_KEY: 'true' })
  t.teardown(() => third.stop('SIGKILL'))
  t.ok(
    third.stdout.some((l) => l.includes('built the metrics aggregates from the stored transactions')),
    'backfilled at start',
  )
  // Compared with the records as they stand now: a payment in flight at the kill may have been
  // found paid on chain (and recorded) since the read above.
  const rebuilt = await k1Settled(third.url, acct)
  t.ok(rebuilt.metrics.tx_count >= api.tx_count, 'no paid record lost')
  t.equal(rebuilt.metrics.tx_count, rebuilt.paid.length, 'the rebuilt aggregates count every paid record')
  t.equal(Math.round(rebuilt.metrics.spend.total * 1e6), Math.round(rebuilt.paid.reduce((n, p) => n + p.amountPaid.usdc, 0) * 1e6), 'and their spend')
  const rejected = (await call(third.url, 'GET', '/v1/agents/k2/metrics?metrics=rejected_count', acct)).body.metrics.rejected_count
  t.ok(rejected.total >= 3 && rejected.by_reason.per_call_limit_exceeded === rejected.total)
  // metrics.requireKey: /metrics behind the account key.
  t.equal((await fetch(`${third.url}/metrics`)).status, 401)
  const scraped = await fetch(`${third.url}/metrics`, { headers: { authorization: `Bearer ${acct}` } })
  t.equal(scraped.status, 200)
  t.match(await scraped.text(), /# TYPE paygate_payments_total counter/)
  t.equal(await third.stop('SIGTERM'), 0)
  const after = await storedAndRecounted(dataDir)
  t.same([...after.stored].sort(), [...after.recounted].sort(), 'the rebuilt aggregates equal a recount too')
})
