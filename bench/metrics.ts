/**
 * `npm run bench metrics` (only when named: it writes about a gigabyte): fills a store with
 * 1,000,000 transactions over 100 agents and 30 days, written through the store layer in
 * bulk exactly as the engine writes them (the record, its indexes and the aggregates
 * contributor's operations in one batch), then starts a gateway on it and times
 * `GET /v1/agents/<id>/metrics` and `GET /v1/metrics` (p50, p95) against a plain
 * `GET /v1/agents/<id>` from the same run. Bounded: the fill stops at `maxFillMs`.
 *
 * `BENCH_METRICS_DIR=<dir>` keeps the filled store there (not removed) and reuses it on the
 * next run when it holds at least as many transactions: fill once, re-measure in seconds.
 */
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { RecordHooks } from '../src/ledger/record-hooks.js'
import { newTxId, Transactions, type TxRecord } from '../src/ledger/transactions.js'
import { Aggregates } from '../src/metrics/aggregates.js'
import { Store } from '../src/store/index.js'
import { systemClock } from '../src/util/clock.js'
import { startTestGateway, tempDir } from '../test/helpers/gateway.js'
import { fmt, percentile } from './lib.js'

const DAY = 86_400_000

export interface MetricsBenchOptions {
  transactions: number
  agents: number
  days: number
  maxFillMs: number
  calls: number
  maxCallMs: number
  /** A kept data directory, reused when already filled (see the top). */
  keepDir?: string
}

/** What a kept directory was filled with (a file beside the store). */
const FILLED_FILE = 'bench-metrics-filled.json'

/** A deterministic pseudo-random sequence (the same store every run). */
function rng(seed: number): () => number {
  let s = seed >>> 0
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0
    return s / 2 ** 32
  }
}

function record(i: number, o: MetricsBenchOptions, now: number, rand: () => number): TxRecord {
  const at = Math.floor(now - rand() * o.days * DAY)
  const rejected = rand() < 0.05
  return {
    id: newTxId(at),
    agentId: `bench-${i % o.agents}`,
    status: rejected ? 'rejected' : 'pending',
    createdAt: at,
    updatedAt: at,
    endpoint: `https://svc${Math.floor(rand() * 20)}.example/api/${Math.floor(rand() * 5)}`,
    method: 'GET',
    protocol: rand() < 0.7 ? 'x402' : 'mpp',
    amount: String(1000 + Math.floor(rand() * 99_000)),
    txHash: null,
    parentTxHash: null,
    depth: 0,
    ...(rejected ? { reason: rand() < 0.5 ? 'daily_budget_exceeded' : 'per_call_limit_exceeded' } : {}),
  }
}

/** Write the transactions as the engine would: each a batch of the record and the contributor's share, 2,000 records a write. */
/** A paid or rejected record `i`, as the engine would have written it. */
function nextRecord(i: number, o: MetricsBenchOptions, now: number, rand: () => number): { record: TxRecord; prev?: TxRecord } {
  const r = record(i, o, now, rand)
  if (r.status === 'rejected') return { record: r }
  return { record: { ...r, status: 'paid', updatedAt: r.createdAt + 50 + Math.floor(rand() * 900) }, prev: r }
}

/** Write records `from` on (the ones before are drawn and dropped: a kept store is filled further, not again). */
async function fill(dataDir: string, o: MetricsBenchOptions, from = 0): Promise<{ n: number; ms: number }> {
  const store = await Store.open(dataDir)
  const transactions = new Transactions(store)
  const aggregates = new Aggregates(store, systemClock)
  await aggregates.start(transactions, store.collection('meta'))
  const hooks = new RecordHooks()
  hooks.add(aggregates.contributor)
  const rand = rng(42)
  const now = Date.now()
  const t0 = Date.now()
  let n = 0
  for (; n < from; n++) nextRecord(n, o, now, rand)
  while (n < o.transactions && Date.now() - t0 < o.maxFillMs) {
    const ops = []
    for (let j = 0; j < 2000 && n < o.transactions; j++, n++) {
      const { record: r, prev } = nextRecord(n, o, now, rand)
      if (!prev) ops.push(...transactions.ops(r), ...hooks.ops({ kind: 'rejected', record: r }))
      else ops.push(...transactions.ops(r), ...hooks.ops({ kind: 'paid', record: r, prev }))
    }
    await store.batch(ops)
    // Keep what is logged and not yet in LevelDB bounded.
    if (n % 100_000 === 0) {
      await store.settled()
      console.log(`  filled ${n} transactions in ${fmt((Date.now() - t0) / 1000, 0)} s`)
    }
  }
  await aggregates.flush() // as a clean stop does (the buckets are written behind the records)
  await store.close()
  return { n, ms: Date.now() - t0 }
}

/**
 * Wall time per call (p50, p95), and the process's CPU time per call (client and server: it
 * runs in this process), which a machine shared with other work inflates far less.
 */
async function timeCalls(count: number, maxMs: number, fn: (i: number) => Promise<void>): Promise<Timing> {
  const ms: number[] = []
  const cpu: number[] = []
  const end = Date.now() + maxMs
  for (let i = 0; i < count && Date.now() < end; i++) {
    const t0 = process.hrtime.bigint()
    const c0 = process.cpuUsage()
    await fn(i)
    const c = process.cpuUsage(c0)
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6)
    cpu.push((c.user + c.system) / 1000)
  }
  ms.sort((a, b) => a - b)
  cpu.sort((a, b) => a - b)
  return { n: ms.length, p50: percentile(ms, 50), p95: percentile(ms, 95), cpuP50: percentile(cpu, 50), cpuP95: percentile(cpu, 95) }
}

interface Timing {
  n: number
  p50: number
  p95: number
  cpuP50: number
  cpuP95: number
}

/** Fill `dataDir`, or reuse what a kept directory already holds. */
async function filledStore(dataDir: string, o: MetricsBenchOptions): Promise<void> {
  const marker = join(dataDir, FILLED_FILE)
  let was = { n: 0, at: '', ms: 0 }
  if (o.keepDir && existsSync(marker)) {
    was = JSON.parse(readFileSync(marker, 'utf8')) as typeof was
    if (was.n >= o.transactions) {
      console.log(`reusing ${dataDir}: ${was.n} transactions filled at ${was.at} (in ${fmt(was.ms / 1000, 1)} s)`)
      return
    }
    console.log(`filling ${dataDir} further from ${was.n} transactions`)
  } else if (o.keepDir) rmSync(dataDir, { recursive: true, force: true }) // no finished fill: start over
  const filled = await fill(dataDir, o, was.n)
  console.log(`filled ${filled.n} transactions over ${o.agents} agents and ${o.days} days in ${fmt(filled.ms / 1000, 1)} s`)
  if (o.keepDir) writeFileSync(marker, JSON.stringify({ n: filled.n, at: new Date().toISOString(), ms: was.ms + filled.ms }))
}

/** The aggregates' part of a start on its own (a backfill when the store's aggregates are older). */
async function timeAggregatesStart(dataDir: string): Promise<void> {
  const store = await Store.open(dataDir)
  try {
    const heap = process.memoryUsage().heapUsed
    const t0 = Date.now()
    const aggregates = new Aggregates(store, systemClock)
    const r = await aggregates.start(new Transactions(store), store.collection('meta'))
    const what = r.backfilled === null ? `read ${r.buckets} buckets` : `built from ${r.backfilled} records (${r.buckets} buckets)`
    console.log(`aggregates start alone: ${what} in ${fmt((Date.now() - t0) / 1000, 2)} s, heap +${fmt((process.memoryUsage().heapUsed - heap) / 2 ** 20, 0)} MiB`)
  } finally {
    await store.close()
  }
}

export async function benchMetrics(o: MetricsBenchOptions): Promise<void> {
  const dataDir = o.keepDir ?? tempDir('paygate-bench-metrics-')
  try {
    await filledStore(dataDir, o)
    await timeAggregatesStart(dataDir)
    const t0 = Date.now()
    const gw = await startTestGateway({
      dataDir,
      env: {
        PAYGATE_LOG_LEVEL: 'warn',
        PAYGATE_API_RATE_LIMIT_PER_MINUTE: '1000000',
        PAYGATE_API_RATE_LIMIT_BURST: '100000',
        PAYGATE_API_RATE_LIMIT_PER_KEY_PER_MINUTE: '1000000',
        PAYGATE_API_RATE_LIMIT_PER_KEY_BURST: '100000',
      },
    })
    const st = gw.gw.metrics.aggregates.stats()
    console.log(
      `gateway started on it in ${fmt((Date.now() - t0) / 1000, 2)} s (${st.buckets} aggregate buckets in memory, ${st.agents} agents; heap ${fmt(process.memoryUsage().heapUsed / 2 ** 20, 0)} MiB)`,
    )
    try {
      // A kept store already has them (409).
      for (let i = 0; i < o.agents; i++) await gw.api('POST', '/v1/agents', { body: { agentId: `bench-${i}` } })
      const get = async (path: string): Promise<void> => {
        const r = await gw.api('GET', path)
        if (r.status !== 200) throw new Error(`${path}: ${r.status} ${r.text}`)
      }
      const windows = ['1h', '24h', '7d', '30d']
      const all = 'spend,tx_count,protocol_split,rejected_count,avg_cost,max_cost,top_endpoints,paid_latency,budget_used_pct,session_calls,delegated_spend,spend_series'
      const agentCall = (i: number) => get(`/v1/agents/bench-${i % o.agents}/metrics?metrics=${all}&window=${windows[i % windows.length]}`)
      const accountCall = (i: number) => get(`/v1/metrics?metrics=${all.replace('budget_used_pct,', '')}&window=${windows[i % windows.length]}`)
      const baseline = (i: number) => get(`/v1/agents/bench-${i % o.agents}`)
      // The first read of each agent over 30 days reads its older hours from the store (once).
      const cold = await timeCalls(o.agents, o.maxCallMs, (i) => get(`/v1/agents/bench-${i}/metrics?metrics=${all}&window=30d`))
      const after = gw.gw.metrics.aggregates.stats()
      console.log(`every agent read once: ${after.buckets} aggregate buckets in memory; heap ${fmt(process.memoryUsage().heapUsed / 2 ** 20, 0)} MiB`)
      await timeCalls(50, 10_000, async (i) => {
        await agentCall(i)
        await accountCall(i)
        await baseline(i)
      })
      const base = await timeCalls(o.calls, o.maxCallMs, baseline)
      const agent = await timeCalls(o.calls, o.maxCallMs, agentCall)
      const account = await timeCalls(Math.ceil(o.calls / 2), o.maxCallMs, accountCall)
      const accountDefault = await timeCalls(Math.ceil(o.calls / 2), o.maxCallMs, (i) => get(`/v1/metrics?window=${windows[i % windows.length]}`))
      const line = (name: string, r: Timing, goal?: number) =>
        console.log(
          `${name.padEnd(44)} n=${String(r.n).padStart(4)}  p50 ${fmt(r.p50).padStart(7)} ms  p95 ${fmt(r.p95).padStart(7)} ms  p95 ${fmt(r.p95 / base.p95).padStart(6)}x baseline  cpu p50 ${fmt(r.cpuP50).padStart(6)} p95 ${fmt(r.cpuP95).padStart(6)} ms${goal ? `  (goal < ${goal} ms: ${r.p95 < goal ? 'met' : 'NOT met'})` : ''}`,
        )
      line('baseline GET /v1/agents/<id>', base)
      line("an agent's first metrics read (30d, all)", cold)
      line('GET /v1/agents/<id>/metrics (all, 1h..30d)', agent, 20)
      line('GET /v1/metrics (all, 1h..30d, 100 agents)', account, 100)
      line('GET /v1/metrics (defaults, 1h..30d)', accountDefault, 100)
    } finally {
      await gw.close()
    }
  } finally {
    if (!o.keepDir) rmSync(dataDir, { recursive: true, force: true })
  }
}
