import t, { type Test } from 'tap'
import { Transactions } from '../../src/ledger/transactions.js'
import { Aggregates, recount } from '../../src/metrics/aggregates.js'
import { CHECKPOINT_MS, DELTA_COLLECTION } from '../../src/metrics/checkpoints.js'
import { DAY_MS, MINUTE_MS } from '../../src/metrics/windows.js'
import { type BatchOp, type LevelStore, Store } from '../../src/store/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { testDir } from '../helpers/gateway.js'
import { writer } from '../helpers/metrics-writer.js'

/**
 * On LevelDB the aggregates' buckets are written behind the records: a record's write carries
 * its deltas as one row, counted in memory once that write is logged; a checkpoint writes the
 * buckets and deletes the rows counted into them, in one batch; a start counts the rows a
 * crash left. The stored buckets must always equal a recount of the records.
 */
const T0 = Date.parse('2026-03-10T12:17:00Z')

async function rows(store: Store): Promise<number> {
  let n = 0
  for await (const _ of store.collection(DELTA_COLLECTION).keys()) n++
  return n
}
async function bucketRows(store: Store): Promise<number> {
  let n = 0
  for await (const _ of store.collection('metricsAgg').keys()) n++
  for await (const _ of store.collection('metricsAccount').keys()) n++
  return n
}
async function started(store: Store, clock: ManualClock): Promise<{ agg: Aggregates; replayed: number }> {
  const agg = new Aggregates(store, clock)
  const r = await agg.start(new Transactions(store), store.collection('meta'))
  return { agg, replayed: r.replayed }
}
const sorted = (m: Map<string, string>): [string, string][] => [...m].sort()
/** A started Aggregates on a new store (closed when `t` ends), with a writer through its contributor. */
async function fresh(t: Test) {
  const store = await Store.open(testDir(t))
  t.teardown(() => store.close())
  const clock = new ManualClock(T0)
  const { agg } = await started(store, clock)
  return { store, clock, agg, w: writer(store, agg) }
}

t.test('a paid record carries its deltas as one row; the next checkpoint writes the buckets and deletes the row', async (t) => {
  const { store, clock, agg, w } = await fresh(t)
  await w.pay('a', T0 - MINUTE_MS, 2_000_000n)
  t.equal(await rows(store), 1, 'one row for the payment')
  t.equal(await bucketRows(store), 0, 'no bucket written with it')
  t.equal(agg.agent('a')?.minutes.get(T0 - MINUTE_MS)?.paid, 1, 'counted in memory once its write is logged')
  await agg.flush()
  t.equal(await rows(store), 0, 'the checkpoint deleted the row')
  t.ok((await bucketRows(store)) >= 4, "the agent's and the account's buckets are stored")
  t.same(sorted(await agg.snapshot()), sorted(await recount(store, w.transactions, clock)))
})

t.test('a row deleted by a checkpoint before LevelDB is written never reaches LevelDB: only the log held it', async (t) => {
  const { store, agg, w } = await fresh(t)
  const level = (store as LevelStore as unknown as { db: { batch: (ops: { key: string }[], ...rest: unknown[]) => Promise<void> } }).db
  const dbBatch = level.batch.bind(level)
  const written: string[] = []
  level.batch = (ops, ...rest) => {
    written.push(...ops.map((o) => o.key))
    return dbBatch(ops, ...rest)
  }
  // No range read meanwhile (one makes LevelDB catch up with the log at once).
  for (let i = 0; i < 5; i++) await w.pay('a', T0 - i * MINUTE_MS, 1000n)
  await agg.flush()
  await store.settled()
  t.ok(
    written.some((k) => k.includes('metricsAgg')),
    'the buckets reached LevelDB',
  )
  t.notOk(
    written.some((k) => k.includes(DELTA_COLLECTION)),
    'no delta row did',
  )
})

t.test('rows a crash left are counted at the next start, once; then the stored buckets equal a recount', async (t) => {
  const dir = testDir(t)
  const clock = new ManualClock(T0)
  const first = await Store.open(dir)
  const { agg: a } = await started(first, clock)
  const w = writer(first, a)
  // Days of traffic: some of it checkpointed, the rest only in rows.
  for (let i = 0; i < 40; i++) await w.pay(`ag${i % 3}`, T0 - i * 7 * 60 * MINUTE_MS, BigInt(1000 + i), { endpoint: `https://e${i % 4}.example/` })
  await a.flush()
  // A count that comes in after a checkpoint was called is in neither its buckets nor its deletions.
  await w.pay('ag2', T0 - 2 * DAY_MS, 555n)
  const checkpoint = a.flush()
  await w.pay('ag1', T0 - 3 * DAY_MS, 777n)
  await checkpoint
  for (let i = 0; i < 30; i++) {
    if (i % 5 === 0) await w.reject(`ag${i % 3}`, T0 - i * MINUTE_MS, 'budget_exceeded')
    else await w.pay(`ag${i % 3}`, T0 - i * 11 * 60 * MINUTE_MS, BigInt(5000 + i), { invocation: { id: `inv${i}`, invokers: ['orch', `ag${i % 3}`] } })
  }
  const left = await rows(first)
  t.ok(left >= 1, `${left} rows left (a checkpoint every ${CHECKPOINT_MS} ms takes the rest)`)
  // The process dies: what the store logged survives, the aggregates' memory does not.
  await first.close()

  const store = await Store.open(dir)
  t.teardown(() => store.close())
  const { agg: b, replayed } = await started(store, clock)
  t.equal(replayed, left, 'every row left is counted at start')
  t.equal(await rows(store), 0, 'and deleted, in the checkpoint that writes them')
  const transactions = new Transactions(store)
  t.same(sorted(await b.snapshot()), sorted(await recount(store, transactions, clock)), 'equal to a recount of the records')
  const again = await started(store, clock)
  t.equal(again.replayed, 0)
  t.same(sorted(await again.agg.snapshot()), sorted(await recount(store, transactions, clock)), 'and as stored')
})

t.test('a record write that fails is not counted', async (t) => {
  const { store, agg, w } = await fresh(t)
  await w.pay('a', T0, 1000n)
  const hooks = w.hooks
  const rec = { ...(await w.transactions.records.get((await first(w.transactions))!))!, id: 'tx_failed' }
  const bad: BatchOp = { type: 'put', coll: store.collection('things'), key: 'x', value: 1n } // cannot be encoded: the batch fails whole
  await t.rejects(store.batch([bad, ...hooks.ops({ kind: 'paid', record: rec, prev: { ...rec, status: 'pending' } })]))
  await agg.flush()
  t.equal(agg.agent('a')?.hours.get(Math.floor(T0 / 3_600_000) * 3_600_000)?.paid, 1, 'one payment counted, not two')
  t.equal(await rows(store), 0)
})

async function first(transactions: Transactions): Promise<string | undefined> {
  for await (const k of transactions.records.keys()) return k
  return undefined
}
