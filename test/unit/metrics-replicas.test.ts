import t, { type Test } from 'tap'
import { Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import { AGGREGATES_META_KEY, AGGREGATES_VERSION, Aggregates, SHARED_META_KEY, type SharedOptions } from '../../src/metrics/aggregates.js'
import { Folder, foldReplica, mergeStored } from '../../src/metrics/fold.js'
import { ACCOUNT_METRICS, AGENT_METRICS, accountMetrics, render, sumAgent } from '../../src/metrics/query.js'
import { accountKey, accountPartKey, bucketKey } from '../../src/metrics/bucket-store.js'
import { FOLD_COLL, FOLD_GEN_KEY, REPLICA_ACCOUNT, REPLICA_AGENTS, replicaIdsIn, spanReads } from '../../src/metrics/replica-rows.js'
import { DAY_MS, HOUR_MS, MINUTE_MS, resolveWindow, type WindowQuery } from '../../src/metrics/windows.js'
import { Store } from '../../src/store/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { STORE_BACKENDS, type StoreBackend, testStore } from '../helpers/gateway.js'
import { writer } from '../helpers/metrics-writer.js'

/**
 * The aggregates on a store shared by replicas: each replica writes rows of its own and every
 * query sums them all from the store. Checked against one unshared Aggregates (the LevelDB
 * path, unchanged) fed the same changes: every metric of every window equal, for each agent and
 * the account, read through either replica, before and after a stopped replica's rows are folded.
 * Run on both backends: on LevelDB the replicas share one store, on PostgreSQL each opens its own.
 */
const T0 = Date.parse('2026-03-10T12:17:00Z')
const WINDOWS: WindowQuery[] = [
  { window: '1h' },
  { window: '24h' },
  { window: '7d' },
  { window: '30d' },
  { from: '2026-02-20T05:00:00Z', to: '2026-03-08T13:30:00Z' },
  { from: '2026-03-09T16:10:00Z', to: '2026-03-10T09:14:00Z' },
  { from: '2026-03-10T11:05:00Z', to: '2026-03-10T11:40:00Z' },
  { from: '2026-03-06T05:00:00Z', to: '2026-03-09T03:00:00Z' },
]
const AGENTS = ['ag0', 'ag1', 'ag2', 'ag3']

function seeded(seed: number): () => number {
  let s = seed
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0
    return s / 2 ** 32
  }
}

type Action =
  | { kind: 'pay'; agentId: string; at: number; amount: bigint; more: Partial<TxRecord>; paidAt: number }
  | { kind: 'reject'; agentId: string; at: number; reason: string }
  | { kind: 'session'; agentId: string; at: number }

/** Traffic as plain data: payments on several endpoints and protocols, rejections, sessions, delegated spend; most of it recent. */
function traffic(seed: number, count: number, now: number, sessions = true): Action[] {
  const rand = seeded(seed)
  const out: Action[] = []
  for (let i = 0; i < count; i++) {
    const r = rand()
    const back = r < 0.4 ? rand() * 2 * HOUR_MS : r < 0.7 ? rand() * 2 * DAY_MS : rand() * 25 * DAY_MS
    const at = Math.floor(now - back)
    const agentId = AGENTS[Math.floor(rand() * AGENTS.length)]!
    const k = rand()
    if (k < 0.1) out.push({ kind: 'reject', agentId, at, reason: rand() < 0.5 ? 'budget_exceeded' : 'domain_blocked' })
    else if (k < 0.15 && sessions) out.push({ kind: 'session', agentId, at })
    else {
      const invocation = k < 0.25 ? { invocation: { id: `inv_${seed}_${i}`, invokers: ['ag0', agentId] } } : {}
      const more = { endpoint: `https://e${Math.floor(rand() * 7)}.example/p`, protocol: rand() < 0.6 ? ('x402' as const) : ('mpp' as const), ...invocation }
      out.push({ kind: 'pay', agentId, at, amount: BigInt(1000 + Math.floor(rand() * 90_000)), more, paidAt: at + Math.floor(rand() * 3000) })
    }
  }
  return out
}

/** Writes actions as the engine does: the record and the contributor's operations in one batch. */
/** One action written through the shared metrics writer. */
function actionWriter(store: Store, aggregates: Aggregates) {
  const w = writer(store, aggregates)
  return async (a: Action): Promise<void> => {
    if (a.kind === 'session') return w.session(a.agentId, a.at)
    if (a.kind === 'reject') return w.reject(a.agentId, a.at, a.reason)
    return w.pay(a.agentId, a.at, a.amount, a.more, a.paidAt)
  }
}

/** A replica's identity; `dead` lists the replicas a test has stopped. */
function liveness(replicaId: string, dead: Set<string>): SharedOptions {
  return { replicaId, alive: async (id) => !dead.has(id), run: (_name, fn) => fn() }
}

/** Every metric of every window, for each agent and the account, as a query answers them. */
async function answers(agg: Aggregates, now: number): Promise<unknown> {
  const out: unknown[] = []
  for (const q of WINDOWS) {
    const span = resolveWindow(q, now)
    for (const agentId of AGENTS) {
      for (const withSeries of [true, false]) {
        const series = withSeries ? new Map<number, bigint>() : null
        out.push([q, agentId, render(AGENT_METRICS, sumAgent(await agg.view(agentId, span), span, true, series), span, series)])
      }
    }
    out.push([q, 'account', accountMetrics(ACCOUNT_METRICS, await agg.accountView(span), span)])
  }
  return out
}

/** Two replicas on one store (on PostgreSQL: each its own connection to one database), and the unshared reference. */
async function setup(t: Test, backend: StoreBackend) {
  const { store, url } = await testStore(t, undefined, backend)
  const other = url ? await Store.open('/nonexistent-unused', { postgresUrl: url }) : store
  if (url) t.teardown(() => other.close())
  const clock = new ManualClock(T0)
  const dead = new Set<string>()
  const replica = async (s: Store, id: string) => {
    const agg = new Aggregates(s, clock, liveness(id, dead))
    await agg.start(new Transactions(s), s.collection('meta'))
    return { agg, write: actionWriter(s, agg), store: s }
  }
  const { store: refStore } = await testStore(t)
  const ref = new Aggregates(refStore, clock)
  await ref.start(new Transactions(refStore), refStore.collection('meta'))
  return { store, other, clock, dead, replica, ref, refWrite: actionWriter(refStore, ref) }
}

const count = async (it: AsyncIterable<unknown>): Promise<number> => {
  let n = 0
  for await (const _ of it) n++
  return n
}

for (const backend of STORE_BACKENDS) {
  t.test(`${backend}: every replica answers the sums over all replicas' writes, before and after a stopped one is folded`, async (t) => {
    const s = await setup(t, backend)
    const a = await s.replica(s.store, 'replica-a')
    const b = await s.replica(s.other, 'replica-b')
    const actions = traffic(7, 300, T0)
    for (const [i, act] of actions.entries()) {
      await (i % 2 ? b : a).write(act)
      await s.refWrite(act)
    }
    const want = await answers(s.ref, T0)
    t.same(await answers(a.agg, T0), want, 'replica A answers the totals of both')
    t.same(await answers(b.agg, T0), want, 'replica B answers the totals of both')
    t.same((await arr(replicaIdsIn(s.store.collection(REPLICA_AGENTS)))).sort(), ['replica-a', 'replica-b'], 'each wrote rows of its own')

    // A stops; B folds its rows into the base rows: the sums stay, A's rows are gone.
    s.dead.add('replica-a')
    const folder = new Folder(s.other, () => s.clock.now(), liveness('replica-b', s.dead), { graceMs: 60_000 })
    t.same(await folder.pass(), [], 'not folded when first seen stopped (grace)')
    s.clock.advance(60_000)
    t.same(await folder.pass(), ['replica-a'], 'folded once stopped for the grace')
    t.same(await arr(replicaIdsIn(s.store.collection(REPLICA_AGENTS))), ['replica-b'], "A's agent rows are gone")
    t.same(await arr(replicaIdsIn(s.store.collection(REPLICA_ACCOUNT))), ['replica-b'], "A's account rows are gone")
    t.same(await answers(b.agg, s.clock.now()), await answers(s.ref, s.clock.now()), 'B answers the same totals after the fold')
    t.equal(await foldReplica(s.store, 'replica-a', s.clock.now()), 0, 'folding it again finds nothing')

    // A restarts under a new id: its rows start empty; what it writes adds up with the rest.
    const a2 = await s.replica(s.store, 'replica-a2')
    for (const [i, act] of traffic(8, 60, s.clock.now()).entries()) {
      await (i % 2 ? b : a2).write(act)
      await s.refWrite(act)
    }
    const after = await answers(s.ref, s.clock.now())
    t.same(await answers(a2.agg, s.clock.now()), after, 'the restarted replica answers the totals')
    t.same(await answers(b.agg, s.clock.now()), after, 'and so does B')
  })
}

t.test('postgres: queries running while a fold moves rows in many transactions always answer the totals', async (t) => {
  const s = await setup(t, 'postgres')
  const a = await s.replica(s.store, 'replica-a')
  const b = await s.replica(s.other, 'replica-b')
  // Payments in distinct minutes: well over one fold chunk (500 rows) of account rows.
  const actions: Action[] = Array.from({ length: 160 }, (_, i) => ({
    kind: 'pay',
    agentId: AGENTS[i % 2]!,
    at: T0 - i * 7 * MINUTE_MS,
    amount: BigInt(1000 + i),
    more: { endpoint: `https://e${i % 3}.example/p` },
    paidAt: T0 - i * 7 * MINUTE_MS + 50,
  }))
  for (const [i, act] of actions.entries()) {
    await (i % 4 ? a : b).write(act)
    await s.refWrite(act)
  }
  const span = resolveWindow({ window: '24h' }, T0)
  const want = JSON.stringify([accountMetrics(ACCOUNT_METRICS, s.ref.account, span), sumAgent(s.ref.agent('ag0'), span, true, null).spend.toString()])
  const read = async () => JSON.stringify([accountMetrics(ACCOUNT_METRICS, await b.agg.accountView(span), span), sumAgent(await b.agg.view('ag0', span), span, true, null).spend.toString()])
  t.equal(await read(), want)
  s.dead.add('replica-a')
  const gen = s.store.collection<number>(FOLD_COLL)
  const before = (await gen.get(FOLD_GEN_KEY)) ?? 0
  let folding = true
  const fold = foldReplica(s.other, 'replica-a', T0).finally(() => (folding = false))
  const seen: string[] = []
  while (folding) seen.push(await read())
  const moved = await fold
  t.ok(moved > 500, `folded ${moved} rows`)
  t.ok(((await gen.get(FOLD_GEN_KEY)) ?? 0) - before >= 2, 'in more than one transaction')
  t.ok(seen.length > 0, `${seen.length} reads during the fold`)
  t.same([...new Set(seen)], [want], 'every read during the fold answered the totals')
  t.equal(await read(), want, 'and after it')
})

t.test('postgres: a shared store without counted base rows builds them from the records once, dropping the replicas rows', async (t) => {
  const s = await setup(t, 'postgres')
  // Written the old way (no shared mode): the stored buckets are one process's view.
  const old = new Aggregates(s.store, s.clock)
  await old.start(new Transactions(s.store), s.store.collection('meta'))
  const oldWrite = actionWriter(s.store, old)
  for (const act of traffic(9, 80, T0, false)) {
    await oldWrite(act)
    await s.refWrite(act)
  }
  const meta = s.store.collection<unknown>('meta')
  t.equal(await meta.get(SHARED_META_KEY), undefined)
  const a = await s.replica(s.store, 'replica-a')
  t.equal(await meta.get(SHARED_META_KEY), AGGREGATES_VERSION, 'counted for the shared store')
  t.equal(await meta.get(AGGREGATES_META_KEY), AGGREGATES_VERSION)
  t.same(await answers(a.agg, T0), await answers(s.ref, T0), 'the totals, from the records')
  t.equal(a.agg.stats().buckets, 0, "the replica's own rows start empty")
  const act = traffic(10, 1, T0, false)[0]!
  await a.write(act)
  await s.refWrite(act)
  const b = await s.replica(s.other, 'replica-b')
  t.equal(await count(replicaIdsIn(s.store.collection(REPLICA_AGENTS))), 1, 'a later start builds nothing again (A keeps its rows)')
  t.same(await answers(b.agg, T0), await answers(s.ref, T0), 'and a replica started later answers the totals')
})

t.test('postgres: a fold pass prunes the base rows past retention and keeps the rest', async (t) => {
  const { store } = await testStore(t, undefined, 'postgres')
  const agents = store.collection<unknown>('metricsAgg')
  const account = store.collection<unknown>('metricsAccount')
  const old = { minute: T0 - 49 * HOUR_MS, hour: T0 - 401 * DAY_MS, day: T0 - 402 * DAY_MS }
  const kept = { minute: T0 - 47 * HOUR_MS, hour: T0 - 399 * DAY_MS, day: T0 - 399 * DAY_MS }
  const bucket = { p: 1, s: '10', x: 1, m: 0, mx: '10', l: { 1: 1 } }
  const rows = (at: typeof old) =>
    (['minute', 'hour', 'day'] as const).flatMap((p) => [
      [agents, bucketKey('ag0', p, at[p])],
      [account, accountKey(p, at[p])],
      [account, accountPartKey(p, at[p], 'a', 'ag0')],
    ]) as [typeof agents, string][]
  await store.batch([...rows(old), ...rows(kept)].map(([coll, key]) => ({ type: 'put' as const, coll, key, value: key.includes('\x00a') ? ['10', 1] : bucket })))
  const folder = new Folder(store, () => T0, liveness('replica-b', new Set()))
  t.same(await folder.pass(), [], 'nothing to fold')
  const left = [...(await arr(agents.keys())), ...(await arr(account.keys()))].sort()
  t.same(
    left,
    rows(kept)
      .map(([, key]) => key)
      .sort(),
    'the rows past retention are gone, the rest kept',
  )
})

t.test('fold arithmetic: a replica row added to the base row, past retention dropped', async (t) => {
  const now = T0
  const key = (h: number) =>
    `ag0\x00h\x00${Math.ceil((T0 - h * HOUR_MS) / HOUR_MS)
      .toString(36)
      .padStart(8, '0')}`
  const b1 = { p: 2, s: '300', x: 2, m: 0, mx: '200', l: { 5: 2 }, e: { 'https://x/p': ['300', 2] }, r: { budget_exceeded: 1 } }
  const b2 = { p: 1, s: '500', x: 0, m: 1, mx: '500', l: { 5: 1, 7: 1 }, e: { 'https://x/p': ['500', 1] }, sc: 3, d: '40' }
  t.same(mergeStored('agents', key(1), b1, b2, now), { p: 3, s: '800', x: 2, m: 1, mx: '500', l: { 5: 3, 7: 1 }, e: { 'https://x/p': ['800', 3] }, r: { budget_exceeded: 1 }, sc: 3, d: '40' })
  t.same(mergeStored('agents', key(1), undefined, b2, now), b2, 'no base row: the replica row as it is')
  t.equal(mergeStored('agents', key(401 * 24), b1, b2, now), undefined, 'past retention: dropped')
  const acct = `h\x00${Math.ceil((T0 - HOUR_MS) / HOUR_MS)
    .toString(36)
    .padStart(8, '0')}`
  t.same(mergeStored('account', `${acct}\x00aag0`, ['100', 1], ['250', 2], now), ['350', 3], 'a by-agent entry: spend and count added')
  t.same(mergeStored('account', acct, { p: 1, s: '100', x: 1, m: 0, mx: '100', l: { 1: 1 } }, { sc: 2 }, now), { p: 1, s: '100', x: 1, m: 0, mx: '100', l: { 1: 1 }, sc: 2 })
})

t.test('span reads: the ranges sumAgent walks, for each precision and series step', async (t) => {
  const r = (q: WindowQuery) => spanReads(resolveWindow(q, T0)).map((x) => [x.precision, new Date(x.from).toISOString().slice(5, 16), new Date(x.to).toISOString().slice(5, 16)])
  t.same(
    r({ window: '24h' }),
    [
      ['minute', '03-09T12:17', '03-09T13:00'],
      ['hour', '03-09T13:00', '03-10T12:00'],
      ['minute', '03-10T12:00', '03-10T12:18'],
    ],
    'hour series: minutes at the edges, whole hours between',
  )
  t.same(r({ window: '1h' }), [['minute', '03-10T11:17', '03-10T12:18']], 'within no whole hour: minutes')
  t.same(
    r({ from: '2026-03-10T09:05:00Z', to: '2026-03-10T11:00:00Z' }),
    [
      ['minute', '03-10T09:05', '03-10T11:00'],
      ['hour', '03-10T10:00', '03-10T11:00'],
    ],
    'a minute series: every minute up to `to` (exclusive), and the whole hour for a sum without it',
  )
  t.same(
    r({ window: '7d' }),
    [
      ['hour', '03-03T12:00', '03-04T00:00'],
      ['day', '03-04T00:00', '03-10T00:00'],
      ['hour', '03-10T00:00', '03-10T13:00'],
    ],
    'a day series: hours at the edges, whole UTC days between',
  )
  t.same(
    r({ from: '2026-03-06T05:00:00Z', to: '2026-03-09T03:00:00Z' }),
    [
      ['hour', '03-06T05:00', '03-09T03:00'],
      ['day', '03-07T00:00', '03-09T00:00'],
    ],
    'an hour series: every hour, and the whole days for a sum without it',
  )
})

async function arr<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = []
  for await (const x of it) out.push(x)
  return out
}
