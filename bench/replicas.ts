/**
 * Paid POST /v1/pay on PostgreSQL, one and three replicas, against LevelDB, in one run (issue
 * 27). Every phase uses the same standalone anvil as its external chain (`deploy-ledger
 * --with-token`), the same x402 merchant process and the same load: 16 agents, each its own
 * caller, bounded in count and time, loopback only.
 *
 *   (a) one gateway on LevelDB (the baseline);
 *   (b) one gateway on PostgreSQL;
 *   (c) three gateways on one PostgreSQL database, the callers spread over them.
 *
 * With BENCH_REPLICAS_EMBEDDED=1, first, for reference, one gateway on LevelDB with its
 * embedded chain (the default; its own merchant, since the chain differs; about 30 s more).
 * Printed: paid calls/s with 16 callers, p50/p95 of those calls and of sequential calls,
 * ratios against (a), the CPU time of each process group per paid call, and on PostgreSQL
 * the statements per paid call (pg_stat_statements) with the costliest. Each phase then
 * waits, bounded, for the ledger contract to count its payments, and says how many it did.
 */
import { readFileSync, rmSync } from 'node:fs'
import { loadavg } from 'node:os'
import { join } from 'node:path'
import { Pool } from 'undici'
import pg from 'pg'
import { createPublicClient, createWalletClient, http, type Address, type PublicClient, type WalletClient } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../src/chain/chain.js'
import { paygateUsdcAbi, paymentLedgerAbi } from '../src/chain/contracts/abis.js'
import { type Anvil, startAnvil } from '../test/helpers/anvil.js'
import { tempDir } from '../test/helpers/gateway.js'
import { type PgCluster, postgresAvailable, startPostgres } from '../test/helpers/postgres.js'
import { call, type GatewayProcess, runCli, spawnGateway } from '../test/helpers/process.js'
import { cpuPerCall, cpuTimes, descendants, fmt, gatewayNodeArgs, percentile, spawnServer } from './lib.js'

export interface ReplicasOptions {
  /** Agents, one caller each. */
  agents: number
  /** Paid calls (at most) spread over the callers to warm every gateway up, and its time bound. */
  warmup: number
  warmupMs: number
  /** Sequential paid calls (one caller, round robin over the gateways), and its time bound. */
  sequential: number
  sequentialMs: number
  /** Paid calls (at most) by all callers at once, and its time bound. */
  concurrent: number
  concurrentMs: number
  /** How long (at most) to wait after the load for the ledger contract to count the phase's payments. */
  drainMs: number
}

const CHAIN_ID = 31339
const MASTER_KEY = 'ab'.repeat(32)
const RICH = '0x56bc75e2d63100000' // 100 ETH of gas
const FUNDS = 10_000_000n // 10 USDC per agent wallet: the merchant asks 1 base unit a call
const LIMITS = {
  PAYGATE_API_RATE_LIMIT_PER_MINUTE: '10000000',
  PAYGATE_API_RATE_LIMIT_BURST: '10000000',
  PAYGATE_API_RATE_LIMIT_PER_KEY_PER_MINUTE: '10000000',
  PAYGATE_API_RATE_LIMIT_PER_KEY_BURST: '10000000',
}

/** The external chain every measured phase shares, and a bank that funds the agents' wallets. */
interface Ext {
  anvil: Anvil
  env: Record<string, string>
  token: Address
  ledger: Address
  pub: PublicClient
  bank: WalletClient
  merchant: string
  merchantPid: number
}

interface Phase {
  label: string
  gateways: number
  /** The database for the PostgreSQL phases. */
  pgUrl?: string
}

interface Figures {
  label: string
  perSec: number
  n: number
  p50: number
  p95: number
  seqP50: number
  seqP95: number
  cpu: string
  chain: string
  ledger: string
  phaseS: number
  statements?: string
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

async function startExternalChain(): Promise<Ext> {
  // Blocks every 250 ms holding every pending transaction, as the embedded chain mines: one block per
  // transaction (anvil's default) falls far behind the ledger records of a few hundred payments a second.
  const anvil = await startAnvil(CHAIN_ID, ['--block-time', '0.25', '--gas-limit', '100000000'])
  const signerKey = generatePrivateKey()
  await anvil.request('anvil_setBalance', [privateKeyToAccount(signerKey).address, RICH])
  const chainEnv = { PAYGATE_CHAIN_RPC_URL: anvil.url, PAYGATE_CHAIN_CHAIN_ID: String(CHAIN_ID), PAYGATE_CHAIN_SIGNER_KEY: signerKey }
  const depDir = tempDir('paygate-bench-deploy-')
  const dep = await runCli({ PAYGATE_DATA_DIR: depDir, ...chainEnv }, ['deploy-ledger', '--with-token'], 90_000)
  rmSync(depDir, { recursive: true, force: true })
  if (dep.code !== 0) throw new Error(`deploy-ledger failed (${dep.code}): ${dep.stderr}`)
  const { token, ledger } = JSON.parse(dep.stdout) as { token: Address; ledger: Address }
  // The bank is minted before any gateway starts: the signer's later nonces are the gateways'.
  const evm = viemChain(CHAIN_ID, 'bench', anvil.url)
  const pub = createPublicClient({ chain: evm, transport: http(anvil.url), pollingInterval: 100 }) as PublicClient
  const bankKey = generatePrivateKey()
  await anvil.request('anvil_setBalance', [privateKeyToAccount(bankKey).address, RICH])
  const owner = createWalletClient({ chain: evm, transport: http(anvil.url), account: privateKeyToAccount(signerKey) })
  const mint = await owner.writeContract({ address: token, abi: paygateUsdcAbi, functionName: 'mint', args: [privateKeyToAccount(bankKey).address, 1_000_000n * FUNDS] })
  await pub.waitForTransactionReceipt({ hash: mint })
  const bank = createWalletClient({ chain: evm, transport: http(anvil.url), account: privateKeyToAccount(bankKey) })
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const m = await spawnServer('./x402-merchant.ts', { BENCH_CHAIN_ID: String(CHAIN_ID), BENCH_TOKEN: token, BENCH_PAY_TO: payTo })
  return { anvil, env: { ...chainEnv, PAYGATE_CHAIN_TOKEN: token, PAYGATE_CHAIN_LEDGER: ledger }, token, ledger, pub, bank, merchant: m.url, merchantPid: m.proc.pid! }
}

/** The phase's gateways, started together, and the account key the first of them made. */
async function startGateways(phase: Phase, ext: Ext | undefined): Promise<{ gws: GatewayProcess[]; dirs: string[]; key: string }> {
  const dirs = Array.from({ length: phase.gateways }, () => tempDir('paygate-bench-'))
  const store: Record<string, string> = phase.pgUrl ? { PAYGATE_STORE_POSTGRES_URL: phase.pgUrl, PAYGATE_MASTER_KEY: MASTER_KEY } : {}
  const env = (d: string): Record<string, string> => ({ PAYGATE_DATA_DIR: d, ...LIMITS, ...(ext?.env ?? {}), ...store })
  const started = await Promise.allSettled(dirs.map((d) => spawnGateway(env(d), [], gatewayNodeArgs(), false, 90_000)))
  const gws = started.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []))
  const failed = started.find((s) => s.status === 'rejected')
  if (failed) {
    await Promise.all(gws.map((g) => g.stop('SIGKILL')))
    throw (failed as PromiseRejectedResult).reason
  }
  const key = dirs.flatMap((d) => {
    try {
      return [readFileSync(join(d, 'account-key'), 'utf8').trim()]
    } catch {
      return []
    }
  })[0]
  if (!key) throw new Error('no gateway wrote the account key')
  return { gws, dirs, key }
}

/** Agents `bench0..` with wallets; on the external chain the bank funds every wallet (sent together, mined in a block or two). */
async function makeAgents(url: string, key: string, agents: number, ext: Ext | undefined): Promise<void> {
  const wallets: Address[] = []
  for (let i = 0; i < agents; i++) {
    const a = await call(url, 'POST', '/v1/agents', key, { agentId: `bench${i}` })
    if (a.status !== 201) throw new Error(`agent: ${a.status} ${a.text}`)
    const w = await call(url, 'POST', '/v1/wallets', key, { agentId: `bench${i}` })
    if (w.status !== 201) throw new Error(`wallet: ${w.status} ${w.text}`)
    wallets.push(w.body.address)
  }
  if (!ext) return
  const account = ext.bank.account!
  const nonce = await ext.pub.getTransactionCount({ address: account.address, blockTag: 'pending' })
  const hashes = await Promise.all(
    wallets.map((to, i) => ext.bank.writeContract({ address: ext.token, abi: paygateUsdcAbi, functionName: 'transfer', args: [to, FUNDS], chain: null, account, nonce: nonce + i, gas: 100_000n })),
  )
  await Promise.all(hashes.map((hash) => ext.pub.waitForTransactionReceipt({ hash, pollingInterval: 100, timeout: 60_000 })))
}

/** `workers` callers, caller i paying as agent i through gateway i mod n, until `count` calls or `maxMs`; each call timed. */
async function load(workers: number, count: number, maxMs: number, pay: (agent: number, gw: number) => Promise<void>, gateways: number): Promise<{ n: number; perSec: number; ms: number[] }> {
  const ms: number[] = []
  let started = 0
  const t0 = performance.now()
  const end = Date.now() + maxMs
  await Promise.all(
    Array.from({ length: workers }, async (_, i) => {
      while (started < count && Date.now() < end) {
        started++
        const c0 = performance.now()
        await pay(i, i % gateways)
        ms.push(performance.now() - c0)
      }
    }),
  )
  const secs = (performance.now() - t0) / 1000
  ms.sort((a, b) => a - b)
  return { n: ms.length, perSec: ms.length / secs, ms }
}

/** The postmaster's pid and the backends under it. */
function postgresPids(cluster: PgCluster | undefined): number[] {
  if (!cluster) return []
  const postmaster = Number(readFileSync(join(cluster.dir, 'data', 'postmaster.pid'), 'utf8').split('\n')[0])
  return [postmaster, ...descendants(postmaster)]
}

/** Statements per paid call from pg_stat_statements (reset before the load), with the costliest by total time. */
async function statements(url: string, paid: number): Promise<string> {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    const r = await c.query<{ query: string; calls: string; ms: number }>(
      "SELECT query, calls::text, total_exec_time AS ms FROM pg_stat_statements JOIN pg_database d ON d.oid = dbid WHERE d.datname = current_database() AND query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC",
    )
    const total = r.rows.reduce((s, x) => s + Number(x.calls), 0)
    const totalMs = r.rows.reduce((s, x) => s + x.ms, 0)
    const top = r.rows.slice(0, 6).map((x) => `    ${fmt(Number(x.calls) / paid, 2)}/call, ${fmt(x.ms / paid, 3)} ms/call: ${x.query.replace(/\s+/g, ' ').slice(0, 110)}`)
    return [`  statements per paid call: ${fmt(total / paid, 1)}, server time ${fmt(totalMs / paid, 3)} ms per paid call; costliest:`, ...top].join('\n')
  } finally {
    await c.end()
  }
}

/** Where a phase's gateways pay: the shared merchant on the external chain, or a merchant of their embedded chain's own. */
async function target(ext: Ext | undefined, gw: GatewayProcess, key: string): Promise<{ merchant: string; pid: number; chainPids: number[]; count: () => Promise<bigint>; stop(): void }> {
  if (ext) {
    const count = () => ext.pub.readContract({ address: ext.ledger, abi: paymentLedgerAbi, functionName: 'count' })
    return { merchant: ext.merchant, pid: ext.merchantPid, chainPids: [ext.anvil.pid], count, stop() {} }
  }
  const info = (await call(gw.url, 'GET', '/v1/chain', key)).body
  const m = await spawnServer('./x402-merchant.ts', { BENCH_CHAIN_ID: String(info.chainId), BENCH_TOKEN: info.token, BENCH_PAY_TO: privateKeyToAccount(generatePrivateKey()).address })
  const chain = createPublicClient({ transport: http(info.rpcUrl) })
  return {
    merchant: m.url,
    pid: m.proc.pid!,
    chainPids: descendants(gw.proc.pid!),
    count: () => chain.readContract({ address: info.ledger, abi: paymentLedgerAbi, functionName: 'count' }),
    stop: () => m.proc.kill('SIGTERM'),
  }
}

/** One phase: start, set up, warm up, measure, wait (bounded) for the ledger, stop (by pid). */
async function runPhase(phase: Phase, ext: Ext | undefined, cluster: PgCluster | undefined, o: ReplicasOptions): Promise<Figures> {
  const t0 = Date.now()
  const { gws, dirs, key } = await startGateways(phase, ext)
  const pools = gws.map((g) => new Pool(g.url, { connections: 32 }))
  let stopMerchant = (): void => {}
  try {
    const tg = await target(ext, gws[0]!, key)
    stopMerchant = tg.stop
    await makeAgents(gws[0]!.url, key, o.agents, ext)
    const counted0 = await tg.count()
    const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' }
    let payments = 0
    const pay = async (agent: number, gw: number): Promise<void> => {
      const r = await pools[gw]!.request({ path: '/v1/pay', method: 'POST', headers, body: JSON.stringify({ agentId: `bench${agent}`, endpoint: `${tg.merchant}/paid`, method: 'GET' }) })
      const text = await r.body.text()
      if (r.statusCode !== 200 || !text.includes('"txHash":"0x')) throw new Error(`pay failed (${phase.label}): ${r.statusCode} ${text}`)
      payments++
    }
    await load(o.agents, o.warmup, o.warmupMs, pay, gws.length)
    let next = 0
    const seq = await load(1, o.sequential, o.sequentialMs, () => pay(next % o.agents, next++ % gws.length), 1)
    if (phase.pgUrl) await pgQuery(phase.pgUrl, 'SELECT pg_stat_statements_reset()')
    const gatewayPids = gws.map((g) => g.proc.pid!)
    const procs = {
      gateways: ext ? gatewayPids : [...gatewayPids, ...tg.chainPids],
      postgres: phase.pgUrl ? postgresPids(cluster) : [],
      chain: ext ? tg.chainPids : [],
      merchant: [tg.pid],
      callers: 'self' as const,
    }
    const countedAtLoad = await tg.count()
    const c0 = cpuTimes(procs)
    const run = await load(o.agents, o.concurrent, o.concurrentMs, pay, gws.length)
    const c1 = cpuTimes(procs)
    const stmts = phase.pgUrl ? await statements(phase.pgUrl, run.n) : undefined
    // The chain mines each ledger record in its own transaction, slower than LevelDB pays: a bounded wait, then stop.
    const waitStart = Date.now()
    let counted = await tg.count()
    while (counted - counted0 < BigInt(payments) && Date.now() - waitStart < o.drainMs) {
      await sleep(250)
      counted = await tg.count()
    }
    const c2 = cpuTimes(procs)
    const cpu = cpuPerCall(c0, c1, run.n)
    const chainRecords = Number(counted - countedAtLoad)
    return {
      label: phase.label,
      perSec: run.perSec,
      n: run.n,
      p50: percentile(run.ms, 50),
      p95: percentile(run.ms, 95),
      seqP50: percentile(seq.ms, 50),
      seqP95: percentile(seq.ms, 95),
      cpu: `${cpu.text}; total ${fmt(cpu.total, 3)}`,
      chain: ext ? `${fmt(chainRecords ? (c2.chain! - c0.chain!) / chainRecords : 0, 3)} ms per ledger record (over the load and the wait)` : 'in the gateway',
      ledger: `${counted - counted0} of ${payments} payments counted by the contract ${fmt((Date.now() - waitStart) / 1000, 1)} s after the last`,
      phaseS: (Date.now() - t0) / 1000,
      ...(stmts ? { statements: stmts } : {}),
    }
  } finally {
    await Promise.all(pools.map((p) => p.close()))
    stopMerchant()
    await Promise.all(gws.map((g) => g.stop('SIGTERM', process.env.BENCH_PROFILE ? 120_000 : 15_000)))
    for (const d of dirs) rmSync(d, { recursive: true, force: true })
  }
}

async function pgQuery(url: string, sql: string): Promise<void> {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    await c.query(sql)
  } finally {
    await c.end()
  }
}

function report(all: Figures[], base: Figures): void {
  console.log('\n== paid POST /v1/pay: LevelDB vs PostgreSQL, one and three replicas (same external chain, merchant and load) ==')
  for (const f of all) {
    const vs = f === base ? '' : `; vs (a): ${fmt(f.perSec / base.perSec)}x calls/s, p50 ${fmt(f.p50 / base.p50)}x, sequential p50 ${fmt(f.seqP50 / base.seqP50)}x`
    console.log(`${f.label}`)
    console.log(`  ${fmt(f.perSec, 0)} paid/s (n=${f.n}), p50 ${fmt(f.p50, 2)} ms p95 ${fmt(f.p95, 2)} ms; sequential p50 ${fmt(f.seqP50, 2)} ms p95 ${fmt(f.seqP95, 2)} ms${vs}`)
    console.log(`  CPU ms per paid call: ${f.cpu}; the chain ${f.chain}`)
    console.log(`  ledger: ${f.ledger}; phase ${fmt(f.phaseS, 0)} s`)
    if (f.statements) console.log(f.statements)
  }
}

export async function benchReplicas(o: ReplicasOptions): Promise<void> {
  if (!postgresAvailable()) {
    console.log('skipped: no PostgreSQL server here (no /usr/lib/postgresql/*/bin/initdb, or no postgres OS user): apt-get install postgresql')
    return
  }
  const t0 = Date.now()
  const load0 = loadavg()
  const all: Figures[] = []
  if (process.env.BENCH_REPLICAS_EMBEDDED === '1') all.push(await runPhase({ label: '(0) 1 gateway, LevelDB, embedded chain (the default; reference only)', gateways: 1 }, undefined, undefined, o))
  let ext: Ext | undefined
  let cluster: PgCluster | undefined
  try {
    ext = await startExternalChain()
    cluster = await startPostgres({ settings: ['shared_preload_libraries=pg_stat_statements', 'pg_stat_statements.track=all'] })
    const dbs = [await cluster.createDatabase('paygate_bench'), await cluster.createDatabase('paygate_bench')]
    for (const url of dbs) await pgQuery(url, 'CREATE EXTENSION pg_stat_statements')
    const base = await runPhase({ label: '(a) 1 gateway, LevelDB, external chain (baseline)', gateways: 1 }, ext, cluster, o)
    all.push(base)
    all.push(await runPhase({ label: '(b) 1 gateway, PostgreSQL', gateways: 1, pgUrl: dbs[0]! }, ext, cluster, o))
    all.push(await runPhase({ label: '(c) 3 gateways, one PostgreSQL database, callers spread over them', gateways: 3, pgUrl: dbs[1]! }, ext, cluster, o))
    report(all, base)
  } finally {
    if (ext) process.kill(ext.merchantPid, 'SIGTERM')
    ext?.anvil.stop()
    cluster?.stop()
  }
  const la = (l: number[]): string => l.map((x) => fmt(x)).join(' ')
  console.log(`(${o.agents} agents, one caller each; whole run ${fmt((Date.now() - t0) / 1000, 0)} s; load average ${la(load0)} at the start, ${la(loadavg())} at the end)`)
}
