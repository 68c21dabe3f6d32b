/**
 * Paid POST /v1/pay on PostgreSQL, one and three replicas, against LevelDB, in one run (issue
 * 27). Every phase uses the same standalone anvil as its external chain (`deploy-ledger
 * --with-token`; each phase records with its own recorder key, so all can run at once), the
 * same x402 merchant process and the same load: 16 agents, each its own caller, bounded in
 * count and time, loopback only.
 *
 *   (a) one gateway on LevelDB (the baseline);
 *   (b) one gateway on PostgreSQL;
 *   (c) three gateways on one PostgreSQL database, the callers spread over them.
 *
 * All phases are started and warmed up first; then they are measured in rounds of short
 * windows taken in turn (the order rotating each round), so a busy moment of a shared machine
 * touches every phase alike. Before each window the chain is let catch up (bounded) with the
 * ledger records of the last one. With BENCH_REPLICAS_EMBEDDED=1 a gateway on LevelDB with its
 * embedded chain (the default; its own merchant, since the chain differs) takes part too.
 *
 * Printed per phase: paid calls/s with 16 callers, p50/p95 of those calls and of sequential
 * calls, the median over the rounds of each round's ratio to (a), the CPU time of each
 * process group per paid call, and on PostgreSQL the statements per paid call
 * (pg_stat_statements) with the costliest.
 */
import { readFileSync, rmSync } from 'node:fs'
import { loadavg } from 'node:os'
import { join } from 'node:path'
import { Pool } from 'undici'
import { createPublicClient, createWalletClient, http, type Address, type Hex, type PublicClient, type WalletClient } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../src/chain/chain.js'
import { paygateUsdcAbi, paymentLedgerAbi } from '../src/chain/contracts/abis.js'
import { type Anvil, startAnvil } from '../test/helpers/anvil.js'
import { tempDir } from '../test/helpers/gateway.js'
import { type PgCluster, postgresAvailable, startPostgres } from '../test/helpers/postgres.js'
import { call, type GatewayProcess, runCli, spawnGateway } from '../test/helpers/process.js'
import { cpuTimes, descendants, fmt, gatewayNodeArgs, percentile, spawnServer } from './lib.js'
import { addStatements, pgQuery, postgresCpu, type Statements, THIS_DB } from './postgres-stats.js'

export interface ReplicasOptions {
  /** Agents, one caller each. */
  agents: number
  /** Paid calls (at most) spread over the callers to warm each phase up, and its time bound. */
  warmup: number
  warmupMs: number
  /** Measuring rounds: each takes one window of every phase. */
  rounds: number
  /** Per window: sequential paid calls (one caller, round robin over the gateways), and the time bound. */
  sequential: number
  sequentialMs: number
  /** Per window: paid calls (at most) by all callers at once, and the time bound. */
  concurrent: number
  concurrentMs: number
  /** Before a window, how long (at most) to wait for the chain to count the ledger records made so far. */
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

/** The external chain the measured phases share, a bank that funds the agents' wallets, and one recorder key per phase. */
interface Ext {
  anvil: Anvil
  env: Record<string, string>
  recorders: Hex[]
  token: Address
  pub: PublicClient
  bank: WalletClient
  merchant: string
  merchantPid: number
  count: () => Promise<bigint>
}

interface PhaseSpec {
  label: string
  gateways: number
  /** The database of a PostgreSQL phase. */
  pgUrl?: string
  /** The recorder key on the external chain; none: the embedded chain. */
  recorder?: Hex
}

/** A phase ready to measure, and what its windows add up. */
interface Phase extends PhaseSpec {
  gws: GatewayProcess[]
  dirs: string[]
  pools: Pool[]
  pay: (agent: number, gw: number) => Promise<void>
  procs: Record<string, number[] | 'self'>
  /** CPU ms used so far by each process group, the cluster's included. */
  cpuNow: () => Record<string, number>
  chainCount: () => Promise<bigint>
  stopMerchant: () => void
  payments: number
  loadMs: number[]
  loadSecs: number
  seqMs: number[]
  perRound: { perSec: number; p50: number; seqP50: number }[]
  cpu: Record<string, number>
  chainCpu: number
  chainRecords: number
  statements: Statements
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

async function startExternalChain(phases: number): Promise<Ext> {
  // Blocks every 250 ms holding every pending transaction, as the embedded chain mines: one block per
  // transaction (anvil's default) falls far behind the ledger records of a few hundred payments a second.
  const anvil = await startAnvil(CHAIN_ID, ['--block-time', '0.25', '--gas-limit', '100000000'])
  const recorders = Array.from({ length: phases }, () => generatePrivateKey())
  for (const k of recorders) await anvil.request('anvil_setBalance', [privateKeyToAccount(k).address, RICH])
  const chainEnv = { PAYGATE_CHAIN_RPC_URL: anvil.url, PAYGATE_CHAIN_CHAIN_ID: String(CHAIN_ID) }
  const depDir = tempDir('paygate-bench-deploy-')
  const dep = await runCli({ PAYGATE_DATA_DIR: depDir, ...chainEnv, PAYGATE_CHAIN_SIGNER_KEY: recorders[0]! }, ['deploy-ledger', '--with-token'], 90_000)
  rmSync(depDir, { recursive: true, force: true })
  if (dep.code !== 0) throw new Error(`deploy-ledger failed (${dep.code}): ${dep.stderr}`)
  const { token, ledger } = JSON.parse(dep.stdout) as { token: Address; ledger: Address }
  const evm = viemChain(CHAIN_ID, 'bench', anvil.url)
  const pub = createPublicClient({ chain: evm, transport: http(anvil.url), pollingInterval: 100 }) as PublicClient
  // Before any gateway starts (the owner's later nonces are the first phase's): the other
  // phases' recorders are added, and the bank is minted.
  const owner = createWalletClient({ chain: evm, transport: http(anvil.url), account: privateKeyToAccount(recorders[0]!) })
  for (const k of recorders.slice(1)) {
    const h = await owner.writeContract({ address: ledger, abi: paymentLedgerAbi, functionName: 'addRecorder', args: [privateKeyToAccount(k).address] })
    await pub.waitForTransactionReceipt({ hash: h })
  }
  const bankKey = generatePrivateKey()
  await anvil.request('anvil_setBalance', [privateKeyToAccount(bankKey).address, RICH])
  const mint = await owner.writeContract({ address: token, abi: paygateUsdcAbi, functionName: 'mint', args: [privateKeyToAccount(bankKey).address, 1_000_000n * FUNDS] })
  await pub.waitForTransactionReceipt({ hash: mint })
  const bank = createWalletClient({ chain: evm, transport: http(anvil.url), account: privateKeyToAccount(bankKey) })
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const m = await spawnServer('./x402-merchant.ts', { BENCH_CHAIN_ID: String(CHAIN_ID), BENCH_TOKEN: token, BENCH_PAY_TO: payTo })
  const count = () => pub.readContract({ address: ledger, abi: paymentLedgerAbi, functionName: 'count' })
  return { anvil, env: { ...chainEnv, PAYGATE_CHAIN_TOKEN: token, PAYGATE_CHAIN_LEDGER: ledger }, recorders, token, pub, bank, merchant: m.url, merchantPid: m.proc.pid!, count }
}

/** The phase's gateways, started together, and the account key the first of them made. */
async function startGateways(spec: PhaseSpec, ext: Ext): Promise<{ gws: GatewayProcess[]; dirs: string[]; key: string }> {
  const dirs = Array.from({ length: spec.gateways }, () => tempDir('paygate-bench-'))
  const store: Record<string, string> = spec.pgUrl ? { PAYGATE_STORE_POSTGRES_URL: spec.pgUrl, PAYGATE_MASTER_KEY: MASTER_KEY } : {}
  const chain: Record<string, string> = spec.recorder ? { ...ext.env, PAYGATE_CHAIN_SIGNER_KEY: spec.recorder } : {}
  const env = (d: string): Record<string, string> => ({ PAYGATE_DATA_DIR: d, ...LIMITS, ...chain, ...store })
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
async function load(workers: number, count: number, maxMs: number, pay: (agent: number, gw: number) => Promise<void>, gateways: number): Promise<{ secs: number; ms: number[] }> {
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
  return { secs: (performance.now() - t0) / 1000, ms }
}

/** Start a phase's gateways (and, on the embedded chain, its merchant), make its agents, warm it up. */
async function preparePhase(spec: PhaseSpec, ext: Ext, cluster: PgCluster, o: ReplicasOptions, phases: Phase[]): Promise<void> {
  const { gws, dirs, key } = await startGateways(spec, ext)
  const pools = gws.map((g) => new Pool(g.url, { connections: 32 }))
  const gatewayPids = gws.map((g) => g.proc.pid!)
  const p: Phase = {
    ...spec,
    gws,
    dirs,
    pools,
    pay: async () => {},
    procs: {},
    cpuNow: () => ({}),
    chainCount: ext.count,
    stopMerchant: () => {},
    payments: 0,
    loadMs: [],
    loadSecs: 0,
    seqMs: [],
    perRound: [],
    cpu: {},
    chainCpu: 0,
    chainRecords: 0,
    statements: new Map(),
  }
  // Listed at once, so that whatever fails from here on, its processes are stopped with the others'.
  phases.push(p)
  let merchant = ext.merchant
  let merchantPid = ext.merchantPid
  let chainPids = [ext.anvil.pid]
  if (!spec.recorder) {
    // The embedded chain: its own token, so its own merchant; the chain runs under the gateway.
    const info = (await call(gws[0]!.url, 'GET', '/v1/chain', key)).body
    const m = await spawnServer('./x402-merchant.ts', { BENCH_CHAIN_ID: String(info.chainId), BENCH_TOKEN: info.token, BENCH_PAY_TO: privateKeyToAccount(generatePrivateKey()).address })
    p.stopMerchant = () => m.proc.kill('SIGTERM')
    merchant = m.url
    merchantPid = m.proc.pid!
    chainPids = descendants(gws[0]!.proc.pid!)
    const chain = createPublicClient({ transport: http(info.rpcUrl) })
    p.chainCount = () => chain.readContract({ address: info.ledger, abi: paymentLedgerAbi, functionName: 'count' })
  }
  p.cpuNow = () => ({ ...cpuTimes(p.procs), postgres: spec.pgUrl ? postgresCpu(cluster) : 0 })
  p.procs = {
    gateways: spec.recorder ? gatewayPids : [...gatewayPids, ...chainPids],
    chain: spec.recorder ? chainPids : [],
    merchant: [merchantPid],
    callers: 'self',
  }
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' }
  p.pay = async (agent, gw) => {
    const r = await pools[gw]!.request({ path: '/v1/pay', method: 'POST', headers, body: JSON.stringify({ agentId: `bench${agent}`, endpoint: `${merchant}/paid`, method: 'GET' }) })
    const text = await r.body.text()
    if (r.statusCode !== 200 || !text.includes('"txHash":"0x')) throw new Error(`pay failed (${spec.label}): ${r.statusCode} ${text}`)
    p.payments++
  }
  await makeAgents(gws[0]!.url, key, o.agents, spec.recorder ? ext : undefined)
  await load(o.agents, o.warmup, o.warmupMs, p.pay, gws.length)
}

/** How many ledger records the chain of `p` should count: the payments of every phase on it (each chain starts with none). */
const expected = (p: Phase, all: Phase[]): bigint => all.filter((q) => q.chainCount === p.chainCount).reduce((s, q) => s + BigInt(q.payments), 0n)

/** One window of a phase: let its chain catch up (bounded), sequential calls, then all callers at once. */
async function window(p: Phase, all: Phase[], o: ReplicasOptions): Promise<{ perSec: number; p50: number; seqP50: number }> {
  const until = Date.now() + o.drainMs
  while ((await p.chainCount()) < expected(p, all) && Date.now() < until) await sleep(100)
  let next = 0
  const seq = await load(1, o.sequential, o.sequentialMs, () => p.pay(next % o.agents, next++ % p.gws.length), 1)
  p.seqMs.push(...seq.ms)
  if (p.pgUrl) await pgQuery(p.pgUrl, `SELECT pg_stat_statements_reset(0, ${THIS_DB}, 0)`)
  const counted0 = await p.chainCount()
  const c0 = p.cpuNow()
  const run = await load(o.agents, o.concurrent, o.concurrentMs, p.pay, p.gws.length)
  const c1 = p.cpuNow()
  for (const k of Object.keys(c1)) p.cpu[k] = (p.cpu[k] ?? 0) + c1[k]! - c0[k]!
  if (p.pgUrl) await addStatements(p.pgUrl, p.statements)
  // The chain's share: its CPU until it has counted this window's records too (bounded), per record.
  const drainUntil = Date.now() + o.drainMs
  let counted = await p.chainCount()
  while (counted < expected(p, all) && Date.now() < drainUntil) {
    await sleep(100)
    counted = await p.chainCount()
  }
  p.chainCpu += cpuTimes({ chain: p.procs.chain! }).chain! - c0.chain!
  p.chainRecords += Number(counted - counted0)
  p.loadMs.push(...run.ms)
  p.loadSecs += run.secs
  const sorted = (ms: number[]): number[] => [...ms].sort((a, b) => a - b)
  return { perSec: run.ms.length / run.secs, p50: percentile(sorted(run.ms), 50), seqP50: percentile(sorted(seq.ms), 50) }
}

const median = (xs: number[]): number =>
  percentile(
    [...xs].sort((a, b) => a - b),
    50,
  )

function report(phases: Phase[], base: Phase): void {
  console.log(`\n== paid POST /v1/pay: LevelDB vs PostgreSQL, one and three replicas (same external chain, merchant and load; ${base.perRound.length} rounds of windows in turn) ==`)
  for (const p of phases) {
    const n = p.loadMs.length
    const ms = [...p.loadMs].sort((a, b) => a - b)
    const seq = [...p.seqMs].sort((a, b) => a - b)
    const ratio = (f: (r: Phase['perRound'][number]) => number): string => fmt(median(p.perRound.map((r, i) => f(r) / f(base.perRound[i]!))))
    const vs = p === base ? '' : `; vs (a), median of the rounds: ${ratio((r) => r.perSec)}x calls/s, p50 ${ratio((r) => r.p50)}x, sequential p50 ${ratio((r) => r.seqP50)}x`
    console.log(p.label)
    console.log(
      `  ${fmt(n / p.loadSecs, 0)} paid/s (n=${n}; rounds ${p.perRound.map((r) => fmt(r.perSec, 0)).join(', ')}), p50 ${fmt(percentile(ms, 50), 2)} ms p95 ${fmt(percentile(ms, 95), 2)} ms; ` +
        `sequential p50 ${fmt(percentile(seq, 50), 2)} ms p95 ${fmt(percentile(seq, 95), 2)} ms${vs}`,
    )
    const cpu = Object.entries(p.cpu).map(([k, v]) => [k, v / n] as const)
    const chain = p.recorder ? `; the chain ${fmt(p.chainRecords ? p.chainCpu / p.chainRecords : 0, 3)} ms per ledger record (its windows and catch-up)` : ' (the chain runs in the gateway)'
    console.log(
      `  CPU ms per paid call: ${cpu.map(([k, v]) => `${k} ${fmt(v, 3)}`).join(', ')}; total ${fmt(
        cpu.reduce((s, [, v]) => s + v, 0),
        3,
      )}${chain}`,
    )
    if (!p.pgUrl) continue
    const st = [...p.statements.entries()].sort((a, b) => b[1].ms - a[1].ms)
    const calls = st.reduce((s, [, v]) => s + v.calls, 0)
    const server = st.reduce((s, [, v]) => s + v.ms, 0)
    console.log(`  statements per paid call: ${fmt(calls / n, 1)}, server time ${fmt(server / n, 3)} ms per paid call; costliest:`)
    for (const [q, v] of st.slice(0, 5)) console.log(`    ${fmt(v.calls / n, 2)}/call, ${fmt(v.ms / n, 3)} ms/call: ${q.slice(0, 110)}`)
  }
}

export async function benchReplicas(o: ReplicasOptions): Promise<void> {
  if (!postgresAvailable()) {
    console.log('skipped: no PostgreSQL server here (no /usr/lib/postgresql/*/bin/initdb, or no postgres OS user): apt-get install postgresql')
    return
  }
  const t0 = Date.now()
  const load0 = loadavg()
  const phases: Phase[] = []
  let ext: Ext | undefined
  let cluster: PgCluster | undefined
  try {
    ext = await startExternalChain(3)
    cluster = await startPostgres({ settings: ['shared_preload_libraries=pg_stat_statements', 'pg_stat_statements.track=all'] })
    const dbs = [await cluster.createDatabase('paygate_bench'), await cluster.createDatabase('paygate_bench')]
    for (const url of dbs) await pgQuery(url, 'CREATE EXTENSION pg_stat_statements')
    const specs: PhaseSpec[] = [
      { label: '(a) 1 gateway, LevelDB, external chain (baseline)', gateways: 1, recorder: ext.recorders[0]! },
      { label: '(b) 1 gateway, PostgreSQL', gateways: 1, pgUrl: dbs[0]!, recorder: ext.recorders[1]! },
      { label: '(c) 3 gateways, one PostgreSQL database, callers spread over them', gateways: 3, pgUrl: dbs[1]!, recorder: ext.recorders[2]! },
    ]
    if (process.env.BENCH_REPLICAS_EMBEDDED === '1') specs.push({ label: '(0) 1 gateway, LevelDB, embedded chain (the default; reference only)', gateways: 1 })
    for (const s of specs) await preparePhase(s, ext, cluster, o, phases)
    for (let r = 0; r < o.rounds; r++) {
      for (let i = 0; i < phases.length; i++) {
        const p = phases[(r + i) % phases.length]!
        p.perRound[r] = await window(p, phases, o)
      }
    }
    report(phases, phases[0]!)
  } finally {
    for (const p of phases) {
      await Promise.all(p.pools.map((x) => x.close()))
      p.stopMerchant()
      await Promise.all(p.gws.map((g) => g.stop('SIGTERM', process.env.BENCH_PROFILE ? 120_000 : 15_000)))
      for (const d of p.dirs) rmSync(d, { recursive: true, force: true })
    }
    if (ext) process.kill(ext.merchantPid, 'SIGTERM')
    ext?.anvil.stop()
    cluster?.stop()
  }
  const la = (l: number[]): string => l.map((x) => fmt(x)).join(' ')
  console.log(`(${o.agents} agents, one caller each; whole run ${fmt((Date.now() - t0) / 1000, 0)} s; load average ${la(load0)} at the start, ${la(loadavg())} at the end)`)
}
