/**
 * `npm run bench [name...]`: every benchmark prints its figures as ratios against a
 * baseline measured in the same run. Loads are bounded in count and time; loopback only.
 */
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { benchAlerts } from './alerts.js'
import { benchMetrics } from './metrics.js'
import { benchPay } from './pay.js'
import { benchPayAb } from './pay-ab.js'
import { benchPeers } from './peers.js'
import { benchProxy } from './proxy.js'
import { benchReplicas } from './replicas.js'
import { benchTree } from './tree.js'
import { benchUsage } from './usage.js'

/** The devnet soak runs in its own process, so its memory figures are its own. */
function benchDevnet(): Promise<void> {
  const r = spawnSync(process.execPath, ['--import', 'tsx', fileURLToPath(new URL('./devnet-soak.ts', import.meta.url))], { stdio: 'inherit', timeout: 300_000 })
  if (r.status !== 0) throw new Error(`devnet soak failed (${r.status ?? r.signal})`)
  return Promise.resolve()
}

/** The benchmarks that start gateways with `spawnGateway` (test/helpers/process.ts). */
const BUILT = new Set(['pay', 'proxy', 'peers', 'alerts', 'replicas'])

const benches: Record<string, () => Promise<void>> = {
  pay: () => benchPay({ sequential: 2000, concurrent: 20_000, maxMs: 20_000 }),
  proxy: () => benchProxy({ count: 30_000, maxMs: 10_000 }),
  peers: () => benchPeers(5, 4),
  devnet: benchDevnet,
  tree: () => benchTree({ nodes: 1000, reads: 50, maxMs: 10_000 }),
  usage: async () => benchUsage({ payments: 2000, windows: 15, maxMs: 20_000 }),
  alerts: () => benchAlerts({ calls: 1000, maxMs: 15_000, refusals: 2000 }),
  // Skipped, saying so, where no PostgreSQL server is installed.
  replicas: () => benchReplicas({ agents: 16, warmup: 1000, warmupMs: 4000, rounds: 3, sequential: 100, sequentialMs: 1500, concurrent: 2000, concurrentMs: 3000, drainMs: 4000 }),
}
/** The embedded chain filled to BENCH_DEVNET_RECORDS (default 1,000,000) ledger records; see devnet-scale.ts. */
function benchDevnetScale(): Promise<void> {
  const maxS = Number(process.env.BENCH_DEVNET_MAX_S ?? 1500)
  const r = spawnSync(process.execPath, ['--import', 'tsx', fileURLToPath(new URL('./devnet-scale.ts', import.meta.url))], { stdio: 'inherit', timeout: (maxS + 300) * 1000 })
  if (r.status !== 0) throw new Error(`devnet scale bench failed (${r.status ?? r.signal})`)
  return Promise.resolve()
}

/**
 * Run only when named: `metrics` writes a million transactions (about a gigabyte) first;
 * `devnet-scale` fills the embedded chain with a million ledger records (up to 25 minutes);
 * `pay-ab` needs another checkout (BENCH_AB_BASE).
 */
const onRequest: Record<string, () => Promise<void>> = {
  'devnet-scale': benchDevnetScale,
  'pay-ab': () => benchPayAb({ rounds: Number(process.env.BENCH_AB_ROUNDS ?? 12), calls: Number(process.env.BENCH_AB_CALLS ?? 200) }),
  metrics: () =>
    benchMetrics({
      transactions: Number(process.env.BENCH_METRICS_TX ?? 1_000_000),
      agents: 100,
      days: 30,
      maxFillMs: 900_000,
      calls: 400,
      maxCallMs: 60_000,
      ...(process.env.BENCH_METRICS_DIR ? { keepDir: process.env.BENCH_METRICS_DIR } : {}),
    }),
}

const wanted = process.argv.slice(2).filter((a) => !a.startsWith('-'))
const names = wanted.length ? wanted : Object.keys(benches)
// Gateways are measured as `npm start` runs them: built (tsc, bundled), not through tsx. pay-ab
// runs both trees from their sources, alike; BENCH_SOURCE=1 runs the others from source too.
// Profiled (BENCH_PROFILE) or with BENCH_UNBUNDLED=1 they run the unbundled build, whose
// profiles name each module's own file.
if (process.env.BENCH_SOURCE !== '1' && names.some((n) => BUILT.has(n))) {
  const b = spawnSync('npm', ['run', '--silent', 'build:server'], { stdio: 'inherit' })
  if (b.status !== 0) throw new Error('building the gateway failed')
  process.env.PAYGATE_SPAWN_BUILT = process.env.BENCH_PROFILE || process.env.BENCH_UNBUNDLED === '1' ? 'modules' : '1'
}
for (const name of names) {
  const b = benches[name] ?? onRequest[name]
  if (!b) {
    console.error(`unknown benchmark ${name}; known: ${[...Object.keys(benches), ...Object.keys(onRequest)].join(', ')}`)
    process.exit(2)
  }
  console.log(`\n# ${name}`)
  await b()
}
