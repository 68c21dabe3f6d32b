import t from 'tap'
import { RecordHooks } from '../../src/ledger/record-hooks.js'
import { newTxId, Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import { AGGREGATES_META_KEY, AGGREGATES_VERSION, Aggregates, recount } from '../../src/metrics/aggregates.js'
import { emptyBucket, mergeInto } from '../../src/metrics/buckets.js'
import { ACCOUNT_METRICS, AGENT_METRICS, accountMetrics, render, sumAgent } from '../../src/metrics/query.js'
import { DAY_MS, HOUR_MS, MINUTE_MS, resolveWindow, type WindowQuery } from '../../src/metrics/windows.js'
import { Store } from '../../src/store/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { testStore } from '../helpers/gateway.js'
import { writer } from '../helpers/metrics-writer.js'

/**
 * The account's own buckets (kept in the same writes as the agents') against the sum over the
 * agents' buckets, and an agent's older hours read lazily against everything in memory.
 */
const T0 = Date.parse('2026-03-10T12:17:00Z')
const WINDOWS: WindowQuery[] = [
  { window: '1h' },
  { window: '24h' },
  { window: '7d' },
  { window: '30d' },
  { from: '2026-02-20T05:00:00Z', to: '2026-03-08T13:30:00Z' },
  { from: '2026-03-09T16:10:00Z', to: '2026-03-10T09:14:00Z' },
]

function seeded(seed: number): () => number {
  let s = seed
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0
    return s / 2 ** 32
  }
}

/** 25 days of traffic over six agents: payments on many endpoints, rejections, sessions (not records: off where a recount compares) and delegated spend. */
async function traffic(w: ReturnType<typeof writer>, now: number, count: number, sessions = true): Promise<void> {
  const rand = seeded(11)
  for (let i = 0; i < count; i++) {
    const at = Math.floor(now - rand() * 25 * DAY_MS)
    const agentId = `ag${Math.floor(rand() * 6)}`
    const r = rand()
    if (r < 0.08) await w.reject(agentId, at, rand() < 0.5 ? 'budget_exceeded' : 'domain_blocked')
    else if (r < 0.12) {
      if (sessions) await w.session(agentId, now - Math.floor(rand() * 40 * HOUR_MS))
    } else {
      const invocation = r < 0.2 ? { invocation: { id: `inv_${i}`, invokers: ['ag0', agentId] } } : {}
      await w.pay(
        agentId,
        at,
        BigInt(1000 + Math.floor(rand() * 90_000)),
        { endpoint: `https://e${Math.floor(rand() * 9)}.example/p`, protocol: rand() < 0.6 ? 'x402' : 'mpp', ...invocation },
        at + Math.floor(rand() * 3000),
      )
    }
  }
}

/** The account's answer the old way: every agent's sum, summed at read time. */
async function sumOverAgents(aggregates: Aggregates, q: WindowQuery, now: number) {
  const span = resolveWindow(q, now)
  const series = new Map<number, bigint>()
  const total = emptyBucket()
  const byAgent: Record<string, { spend: { total: number }; tx_count: number }> = {}
  for (const id of aggregates.agentIds()) {
    const b = sumAgent(await aggregates.ready(id, span.from), span, true, series)
    mergeInto(total, b, true)
    if (b.paid) byAgent[id] = render(['spend', 'tx_count'], b, span, null) as { spend: { total: number }; tx_count: number }
  }
  return { metrics: render(ACCOUNT_METRICS, total, span, series), byAgent }
}

t.test('the account buckets equal the sum over the agents, live and after a restart, for every metric and window', async (t) => {
  const { store, dir } = await testStore(t)
  const clock = new ManualClock(T0)
  const aggregates = new Aggregates(store, clock)
  await aggregates.start(new Transactions(store), store.collection('meta'))
  const w = writer(store, aggregates)
  await traffic(w, T0, 600)
  const compare = async (agg: Aggregates, when: string): Promise<void> => {
    for (const q of WINDOWS) {
      const span = resolveWindow(q, clock.now())
      const account = accountMetrics(ACCOUNT_METRICS, agg.account, span)
      const agents = await sumOverAgents(agg, q, clock.now())
      t.same(account.metrics, agents.metrics, `${when} ${JSON.stringify(q)}`)
      t.same(account.by_agent, agents.byAgent, `${when} by_agent ${JSON.stringify(q)}`)
      t.equal(account.top_spenders.length, Object.keys(agents.byAgent).length)
    }
  }
  await compare(aggregates, 'live')
  // The process stops without a last checkpoint (its rows left for the next start) and starts
  // again. A second instance on the live store would race the first one's checkpoints.
  await store.close()
  const next = await Store.open(dir)
  try {
    await compare(await restarted(next, clock), 'restarted')
  } finally {
    await next.close()
  }
  const all = accountMetrics(ACCOUNT_METRICS, aggregates.account, resolveWindow({ window: '30d' }, clock.now())).metrics as {
    tx_count: number
    session_calls: number
    delegated_spend: { usdc: number }
  }
  t.ok(all.tx_count > 400 && all.session_calls > 0 && all.delegated_spend.usdc > 0, 'the traffic has every kind')
})

async function restarted(store: Store, clock: ManualClock): Promise<Aggregates> {
  const a = new Aggregates(store, clock)
  const r = await a.start(new Transactions(store), store.collection('meta'))
  if (r.backfilled !== null) throw new Error('expected a load')
  return a
}

t.test("an agent's older hours read lazily answer as everything in memory does; a late payment is prepared", async (t) => {
  const { store } = await testStore(t)
  const clock = new ManualClock(T0)
  const first = new Aggregates(store, clock)
  await first.start(new Transactions(store), store.collection('meta'))
  await traffic(writer(store, first), T0, 400, false)
  await first.flush() // as a clean stop does
  clock.advance(5 * MINUTE_MS)
  const lazy = await restarted(store, clock)
  const s = lazy.stats()
  t.equal(s.loadedAgents, 0, 'no agent read in full at start')
  t.ok(s.buckets < first.stats().buckets, `${s.buckets} buckets in memory at start, of ${first.stats().buckets}`)
  // Everything in memory: the instance that counted the traffic live (sessions are not records, so not a recount).
  const eager = first
  t.equal(eager.stats().loadedAgents, eager.stats().agents)
  for (const q of WINDOWS) {
    const span = resolveWindow(q, clock.now())
    for (const id of eager.agentIds()) {
      const series = () => new Map<number, bigint>()
      const a = series()
      const b = series()
      t.same(
        render(AGENT_METRICS, sumAgent(await lazy.ready(id, span.from), span, true, a), span, a),
        render(AGENT_METRICS, sumAgent(eager.agent(id), span, true, b), span, b),
        `${id} ${JSON.stringify(q)}`,
      )
    }
  }
  // A payment created 20 days ago and paid now, for an agent whose older hours are not read yet.
  const late = await restarted(store, clock)
  const w = writer(store, late)
  t.ok(late.agent('ag3')!.loadedFrom > T0 - 20 * DAY_MS)
  await w.pay('ag3', T0 - 20 * DAY_MS, 7_000_000n, { invocation: { id: 'inv_late', invokers: ['ag4'] } }, clock.now())
  t.equal(late.agent('ag3')!.loadedFrom, Number.NEGATIVE_INFINITY, 'prepare read its older hours before the write')
  t.equal(late.agent('ag4')!.loadedFrom, Number.NEGATIVE_INFINITY, "and the invoker's")
  t.equal(await store.collection('meta').get(AGGREGATES_META_KEY), AGGREGATES_VERSION, 'the version stays')
  t.same([...(await late.snapshot())].sort(), [...(await recount(store, w.transactions, clock))].sort(), 'equal to a recount, the account included')
  await late.flush()
  t.same([...(await (await restarted(store, clock)).snapshot())].sort(), [...(await recount(store, w.transactions, clock))].sort(), 'and as stored')
})

t.test('a change to an hour not read (no prepare) is counted once its hours are read; the version stays', async (t) => {
  const { store } = await testStore(t)
  const clock = new ManualClock(T0)
  const first = new Aggregates(store, clock)
  await first.start(new Transactions(store), store.collection('meta'))
  await traffic(writer(store, first), T0, 200, false)
  await first.flush()
  const lazy = await restarted(store, clock)
  const transactions = new Transactions(store)
  const hooks = new RecordHooks()
  hooks.add(lazy.contributor)
  const at = T0 - 15 * DAY_MS
  const pending: TxRecord = {
    id: newTxId(at),
    agentId: 'ag2',
    status: 'pending',
    createdAt: at,
    updatedAt: at,
    endpoint: 'https://x.example/',
    method: 'GET',
    protocol: 'x402',
    amount: '3000000',
    txHash: null,
    parentTxHash: null,
    depth: 0,
  }
  await store.batch(transactions.ops(pending))
  const paid: TxRecord = { ...pending, status: 'paid', updatedAt: clock.now() }
  t.ok(lazy.agent('ag2')!.loadedFrom > at, "the agent's older hours are not read yet")
  await store.batch([...transactions.ops(paid, pending), ...hooks.ops({ kind: 'paid', record: paid, prev: pending })])
  await lazy.flush() // counted once its hours are read, then written
  t.equal(await store.collection('meta').get(AGGREGATES_META_KEY), AGGREGATES_VERSION, 'the version stays')
  t.same([...(await lazy.snapshot())].sort(), [...(await recount(store, transactions, clock))].sort(), 'memory counts it')
  const next = new Aggregates(store, clock)
  t.equal((await next.start(transactions, store.collection('meta'))).backfilled, null, 'the next start loads')
  t.same([...(await next.snapshot())].sort(), [...(await recount(store, transactions, clock))].sort(), 'as stored')
})
