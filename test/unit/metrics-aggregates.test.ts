import t from 'tap'
import { type RecordChange, RecordHooks } from '../../src/ledger/record-hooks.js'
import { newTxId, Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import { AGGREGATES_META_KEY, AGGREGATES_VERSION, Aggregates, recount } from '../../src/metrics/aggregates.js'
import { ENDPOINTS_PER_HOUR, OTHER_ENDPOINT } from '../../src/metrics/buckets.js'
import { ACCOUNT_METRICS, AGENT_METRICS, accountMetrics, parseMetrics, render, sumAgent } from '../../src/metrics/query.js'
import { HOUR_MS, MINUTE_MS, resolveWindow } from '../../src/metrics/windows.js'
import type { Store } from '../../src/store/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { testStore } from '../helpers/gateway.js'

/**
 * The aggregates on a real store with a clock moved by hand: records written as the engine
 * writes them (the record and the contributor's operations in one batch), read back through
 * the windows at their stated precision.
 */
const T0 = Date.parse('2026-03-10T12:00:00Z')

function harness(store: Store, clock: ManualClock) {
  const transactions = new Transactions(store)
  const aggregates = new Aggregates(store, clock)
  const hooks = new RecordHooks()
  hooks.add(aggregates.contributor)
  const write = (change: RecordChange & { record: TxRecord }, prev?: TxRecord) => store.batch([...transactions.ops(change.record, prev), ...hooks.ops(change)])
  /** A payment made at `at` (ms), paid `latencyMs` later. */
  async function pay(agentId: string, at: number, amount: bigint, more: Partial<TxRecord> = {}, latencyMs = 120): Promise<TxRecord> {
    const pending: TxRecord = {
      id: newTxId(at),
      agentId,
      status: 'pending',
      createdAt: at,
      updatedAt: at,
      endpoint: 'https://api.example/v1/data',
      method: 'GET',
      protocol: 'x402',
      amount: amount.toString(),
      txHash: null,
      parentTxHash: null,
      depth: 0,
      ...more,
    }
    await write({ kind: 'reserved', record: pending })
    const paid: TxRecord = { ...pending, status: 'paid', updatedAt: at + latencyMs }
    await write({ kind: 'paid', record: paid, prev: pending }, pending)
    return paid
  }
  async function reject(agentId: string, at: number, reason: string): Promise<void> {
    const r: TxRecord = {
      id: newTxId(at),
      agentId,
      status: 'rejected',
      createdAt: at,
      updatedAt: at,
      endpoint: 'https://api.example/x',
      method: 'GET',
      protocol: 'x402',
      amount: '5',
      txHash: null,
      parentTxHash: null,
      depth: 0,
      reason,
    }
    await write({ kind: 'rejected', record: r })
  }
  const metrics = (agentId: string, q: Parameters<typeof resolveWindow>[0], names = AGENT_METRICS as readonly (typeof AGENT_METRICS)[number][]) => {
    const span = resolveWindow(q, clock.now())
    const series = new Map<number, bigint>()
    return render(names, sumAgent(aggregates.agent(agentId), span, true, series), span, series) as Record<string, any>
  }
  return { transactions, aggregates, hooks, pay, reject, metrics }
}

t.test('payments fall in and out of windows at the stated precision', async (t) => {
  const { store } = await testStore(t)
  const clock = new ManualClock(T0)
  const h = harness(store, clock)
  await h.pay('a1', T0 - 30 * MINUTE_MS, 1_000_000n) // 11:30
  await h.pay('a1', T0 - 60 * MINUTE_MS - 30_000, 2_000_000n) // 10:59:30, in the minute 10:59
  await h.pay('a1', T0 - 61 * MINUTE_MS, 4_000_000n) // 10:59:00
  await h.pay('a1', T0 - 62 * MINUTE_MS, 8_000_000n) // 10:58, out of 1h
  await h.pay('a1', T0 - 3 * 24 * HOUR_MS - 10 * MINUTE_MS, 16_000_000n) // 3 days ago 11:50
  clock.set(T0 + 20_000) // 12:00:20: 1h reads the minute buckets 11:00..12:00
  t.same(h.metrics('a1', { window: '1h' }).spend, { total: 1 }, 'exact to the minute: 10:59 is out at 12:00:20')
  clock.set(T0 - 20_000) // 11:59:40: 1h reads 10:59..11:59
  t.same(h.metrics('a1', { window: '1h' }).spend, { total: 7 }, '10:59:00 and 10:59:30 are in, 10:58 is not')
  t.equal(h.metrics('a1', { window: '1h' }).tx_count, 3)
  clock.set(T0)
  t.same(h.metrics('a1', { window: '24h' }).spend, { total: 15 })
  t.same(h.metrics('a1', { window: '7d' }).spend, { total: 31 }, 'to the hour')
  // 7 days later at 12:20 the window (to the hour) starts at noon 3 days before T0: the 11:50 payment is out.
  clock.set(T0 + 4 * 24 * HOUR_MS + 20 * MINUTE_MS)
  const span = resolveWindow({ window: '7d' }, clock.now())
  t.equal(span.from, T0 - 3 * 24 * HOUR_MS, 'the window starts at noon 3 days before T0 (hour precision)')
  t.same(h.metrics('a1', { window: '7d' }).spend, { total: 15 }, 'the 11:50 payment of that day is out at the hour')
  t.same(h.metrics('a1', { from: new Date(T0 - 3 * 24 * HOUR_MS - HOUR_MS).toISOString(), to: new Date(T0 - 3 * 24 * HOUR_MS).toISOString() }).spend, { total: 16 })
})

t.test('every metric, with protocol split, rejections by reason, delegated spend, sessions and endpoints', async (t) => {
  const { store } = await testStore(t)
  const clock = new ManualClock(T0)
  const h = harness(store, clock)
  await h.pay('orch', T0 - 10 * MINUTE_MS, 3_000_000n, { protocol: 'x402' }, 50)
  await h.pay('orch', T0 - 9 * MINUTE_MS, 1_000_000n, { protocol: 'mpp', endpoint: 'https://mpp.example/q' }, 400)
  await h.pay('orch', T0 - 8 * MINUTE_MS, 2_000_000n, { protocol: 'mpp', endpoint: 'https://mpp.example/q' }, 800)
  await h.pay('orch', T0 - 8 * MINUTE_MS, 9_000_000n, { kind: 'invocation' }) // a run total: not spend
  await h.pay('sub', T0 - 7 * MINUTE_MS, 500_000n, { invocation: { id: 'inv_1', invokers: ['orch'] } })
  await h.pay('subsub', T0 - 7 * MINUTE_MS, 250_000n, { invocation: { id: 'inv_2', invokers: ['orch', 'sub'] } })
  await h.reject('orch', T0 - 5 * MINUTE_MS, 'budget_exceeded')
  await h.reject('orch', T0 - 4 * MINUTE_MS, 'budget_exceeded')
  await h.reject('orch', T0 - 3 * MINUTE_MS, 'domain_blocked')
  await store.batch([...h.hooks.ops({ kind: 'session', agentId: 'orch', at: T0 - MINUTE_MS, endpoint: 'https://mpp.example/q' })])
  const m = h.metrics('orch', { window: '1h' })
  t.same(m.spend, { total: 6 })
  t.equal(m.tx_count, 3)
  t.equal(m.protocol_split.x402 + m.protocol_split.mpp, 1)
  t.ok(Math.abs(m.protocol_split.x402 - 1 / 3) < 1e-12)
  t.same(m.rejected_count, { total: 3, by_reason: { budget_exceeded: 2, domain_blocked: 1 } })
  t.same(m.avg_cost, { usdc: 2 })
  t.same(m.max_cost, { usdc: 3 })
  t.same(
    m.top_endpoints,
    [
      { endpoint: 'https://api.example/v1/data', spend: { usdc: 3 }, tx_count: 1 },
      { endpoint: 'https://mpp.example/q', spend: { usdc: 3 }, tx_count: 2 },
    ].sort((a, b) => b.tx_count - a.tx_count),
  )
  t.ok(m.paid_latency.p50_ms >= 400 / 1.0906 && m.paid_latency.p50_ms <= 400 * 1.0906, `p50 ${m.paid_latency.p50_ms}`)
  t.ok(m.paid_latency.p95_ms >= 800 / 1.0906 && m.paid_latency.p95_ms <= 800 * 1.0906, `p95 ${m.paid_latency.p95_ms}`)
  t.equal(m.session_calls, 1)
  t.same(m.delegated_spend, { usdc: 0.75 }, "what sub and subsub paid inside orch's invocations")
  t.same(h.metrics('sub', { window: '1h' }).delegated_spend, { usdc: 0.25 })
  t.same(h.metrics('subsub', { window: '1h' }).delegated_spend, { usdc: 0 })
  t.equal(m.spend_series.length, 61)
  t.equal(
    m.spend_series.reduce((s: number, p: { usdc: number }) => s + p.usdc, 0),
    6,
  )
  const none = h.metrics('nobody', {})
  t.same(none.protocol_split, { x402: 0, mpp: 0 }, 'all 0 without payments')
  t.same(none.paid_latency, { p50_ms: null, p95_ms: null })

  const span = resolveWindow({ window: '24h' }, clock.now())
  const account = accountMetrics(parseMetrics('spend,tx_count,delegated_spend', ACCOUNT_METRICS), h.aggregates.account, span)
  t.same(account.metrics.spend, { total: 6.75 })
  t.equal(account.metrics.tx_count, 5)
  t.same(
    account.top_spenders.map((s) => s.agentId),
    ['orch', 'sub', 'subsub'],
  )
  t.same(account.by_agent.sub, { spend: { total: 0.5 }, tx_count: 1 })
})

t.test('endpoints past the cap per agent and hour fold into other', async (t) => {
  const { store } = await testStore(t)
  const clock = new ManualClock(T0)
  const h = harness(store, clock)
  for (let i = 0; i < ENDPOINTS_PER_HOUR + 5; i++) await h.pay('a', T0 - 10 * MINUTE_MS, 1000n, { endpoint: `https://e${i}.example/` })
  const b = sumAgent(h.aggregates.agent('a'), resolveWindow({ window: '1h' }, T0), true, null)
  t.equal(b.endpoints.size, ENDPOINTS_PER_HOUR + 1)
  t.same(b.endpoints.get(OTHER_ENDPOINT), { spend: 5000n, n: 5 })
})

t.test('a store with records and no aggregates is built at start; with them, loaded; equal to a recount', async (t) => {
  const { store } = await testStore(t)
  const clock = new ManualClock(T0)
  const transactions = new Transactions(store)
  // Records written without any contributor (a store from before the metrics).
  const bare = new RecordHooks()
  const write = (r: TxRecord) => store.batch(transactions.ops(r))
  for (let i = 0; i < 30; i++) {
    await write({
      id: newTxId(T0 - i * 7 * MINUTE_MS),
      agentId: `ag${i % 3}`,
      status: i % 5 === 0 ? 'rejected' : 'paid',
      reason: 'budget_exceeded',
      createdAt: T0 - i * 7 * MINUTE_MS,
      updatedAt: T0 - i * 7 * MINUTE_MS + 90,
      endpoint: 'https://x.example/p',
      method: 'GET',
      protocol: i % 2 ? 'mpp' : 'x402',
      amount: '250000',
      txHash: null,
      parentTxHash: null,
      depth: 0,
    })
  }
  t.same(bare.ops({ kind: 'session', agentId: 'x', at: 0, endpoint: '' }), [])
  const meta = store.collection<unknown>('meta')
  t.equal(await meta.get(AGGREGATES_META_KEY), undefined)
  const fresh = new Aggregates(store, clock)
  const built = await fresh.start(transactions, meta)
  t.equal(built.backfilled, 30)
  t.ok(built.buckets > 0)
  t.equal(await meta.get(AGGREGATES_META_KEY), AGGREGATES_VERSION)
  const span = resolveWindow({ window: '24h' }, T0)
  t.same(render(['spend', 'tx_count', 'rejected_count'], sumAgent(fresh.agent('ag0'), span, false, null), span, null), {
    spend: { total: 2 },
    tx_count: 8,
    rejected_count: { total: 2, by_reason: { budget_exceeded: 2 } },
  })
  const again = new Aggregates(store, clock)
  const loaded = await again.start(transactions, meta)
  t.equal(loaded.backfilled, null, 'built once: the next start loads')
  t.ok(loaded.buckets > 0 && loaded.buckets <= built.buckets, 'at start the recent buckets are read (the rest when first needed)')
  t.same([...(await again.snapshot())].sort(), [...(await recount(store, transactions, clock))].sort())
})

t.test('buckets past retention are dropped (minutes after 48 h, hours after 400 days)', async (t) => {
  const { store } = await testStore(t)
  const clock = new ManualClock(T0)
  const h = harness(store, clock)
  await h.pay('a', T0, 1_000_000n)
  clock.advance(49 * HOUR_MS)
  await h.pay('a', clock.now(), 1_000_000n)
  const a = h.aggregates.agent('a')!
  t.equal(a.minutes.size, 1, 'the old minute is gone')
  t.equal(a.hours.size, 2)
  await h.aggregates.flush() // the buckets are written behind the records: at the next checkpoint
  await store.settled()
  const keys: string[] = []
  for await (const k of h.aggregates.coll.keys()) keys.push(k)
  t.equal(keys.filter((k) => k.includes('\x00m\x00')).length, 1, 'and deleted from the store')
  t.same(h.metrics('a', { from: new Date(T0 - HOUR_MS).toISOString(), to: new Date(T0 + HOUR_MS).toISOString() }).spend, { total: 1 }, 'hours still answer')
})

t.test('long windows read whole days from the day sums: the same totals as hour by hour, live and after a load', async (t) => {
  const { store } = await testStore(t)
  const clock = new ManualClock(T0 + 17 * MINUTE_MS)
  const h = harness(store, clock)
  let seed = 7
  const rand = () => {
    seed = (seed * 1664525 + 1013904223) >>> 0
    return seed / 2 ** 32
  }
  for (let i = 0; i < 300; i++) {
    const at = Math.floor(clock.now() - rand() * 25 * 24 * HOUR_MS)
    if (i % 10 === 0) await h.reject('a', at, 'budget_exceeded')
    else await h.pay('a', at, BigInt(1000 + Math.floor(rand() * 9000)), { endpoint: `https://e${i % 7}.example/`, protocol: i % 3 ? 'x402' : 'mpp' })
  }
  const names = ['spend', 'tx_count', 'protocol_split', 'rejected_count', 'max_cost', 'top_endpoints', 'paid_latency'] as const
  const both = async (agg: Aggregates, q: Parameters<typeof resolveWindow>[0]) => {
    const span = resolveWindow(q, clock.now())
    const a = await agg.ready('a', span.from)
    const byDays = render(names, sumAgent(a, span, true, null), span, null)
    const byHours = render(names, sumAgent(a, { ...span, step: HOUR_MS }, true, new Map()), span, null)
    return [byDays, byHours]
  }
  for (const q of [{ window: '7d' }, { window: '30d' }, { from: '2026-02-20T05:00:00Z', to: '2026-03-08T13:30:00Z' }]) {
    const [byDays, byHours] = await both(h.aggregates, q)
    t.same(byDays, byHours, JSON.stringify(q))
  }
  // Minute-exact spans: whole hours from the hour buckets, the same as minute by minute.
  for (const q of [{ window: '24h' }, { from: new Date(clock.now() - 20 * HOUR_MS - 7 * MINUTE_MS).toISOString(), to: new Date(clock.now() - 3 * MINUTE_MS).toISOString() }]) {
    const span = resolveWindow(q, clock.now())
    t.equal(span.precision, 'minute')
    const byHours = render(names, sumAgent(h.aggregates.agent('a'), span, true, null), span, null)
    const byMinutes = render(names, sumAgent(h.aggregates.agent('a'), { ...span, step: MINUTE_MS }, true, new Map()), span, null)
    t.same(byHours, byMinutes, JSON.stringify(q))
    t.ok((byHours as { tx_count: number }).tx_count > 5)
  }
  await h.aggregates.flush() // as a clean stop does
  const loaded = new Aggregates(store, clock)
  await store.batch([{ type: 'put', coll: store.collection('meta'), key: AGGREGATES_META_KEY, value: AGGREGATES_VERSION }])
  await loaded.start(h.transactions, store.collection('meta'))
  t.ok(loaded.agent('a')!.loadedFrom > clock.now() - 3 * 24 * HOUR_MS, "at start only the agent's recent hours are read")
  t.ok(loaded.agent('a')!.hours.size < h.aggregates.agent('a')!.hours.size)
  const [live] = await both(h.aggregates, { window: '30d' })
  const [again, againHours] = await both(loaded, { window: '30d' })
  t.equal(loaded.agent('a')!.loadedFrom, Number.NEGATIVE_INFINITY, 'a 30-day read reads the older hours')
  t.same(again, live, 'the day sums rebuilt at load')
  t.same(againHours, live)
  t.equal((live as { tx_count: number }).tx_count, 270)
})

t.test('the protocol split: each share as it is written (0.2, not 1 - 0.8)', async (t) => {
  const { store } = await testStore(t)
  const h = harness(store, new ManualClock(T0))
  await h.pay('four', T0 - 10 * MINUTE_MS, 1_000n, { protocol: 'mpp' })
  for (let i = 0; i < 4; i++) await h.pay('four', T0 - 9 * MINUTE_MS, 1_000n, { protocol: 'x402' })
  t.same(h.metrics('four', { window: '1h' }).protocol_split, { x402: 0.8, mpp: 0.2 })
})
