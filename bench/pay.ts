/**
 * Paid POST /v1/pay against a local x402 v2 merchant, in the same run as its floor: two
 * plain round trips to the merchant (a paid call is a 402 then a paid retry). Paygate, the
 * merchant and the callers each run in their own process, as in a deployment. Everything durable: LevelDB records, ledger outbox, the embedded chain; the
 * load ends when the ledger contract counts every payment. Then the gateway is SIGKILLed and
 * started again on its data dir, timed.
 */
import { readFileSync, rmSync } from 'node:fs'
import { availableParallelism } from 'node:os'
import { join } from 'node:path'
import { Pool } from 'undici'
import { createPublicClient, http } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { paymentLedgerAbi } from '../src/chain/contracts/abis.js'
import { tempDir } from '../test/helpers/gateway.js'
import { call, spawnGateway } from '../test/helpers/process.js'
import { cpuPerCall, cpuTimes, descendants, fmt, gatewayNodeArgs, type Latencies, spawnServer, threadCpuMs, throughput, timeAlternating } from './lib.js'

/** Agents paying in the 16-agent phase, one caller each at a time. */
const CALLERS = 16

export async function benchPay(opts: { sequential: number; concurrent: number; maxMs: number }): Promise<void> {
  const s = await setUp()
  report(await measure(s, opts), s.payments.n)
  await s.apool.close()
  await s.mpool.close()
  s.merchant.kill('SIGTERM')
  // With a profile, a clean stop: a SIGKILL would lose it, and writing a long one takes a while.
  if (process.env.BENCH_PROFILE) await s.gw.stop('SIGTERM', 120_000)
  else await restartAfterKill(s)
  process.off('exit', s.onExit)
  rmSync(s.dataDir, { recursive: true, force: true })
}

type Setup = Awaited<ReturnType<typeof setUp>>

/** The gateway and the merchant, each in its own process, the agents with wallets, and the calls the phases make. */
async function setUp() {
  const dataDir = tempDir('paygate-bench-')
  const gw = await spawnGateway(
    {
      PAYGATE_DATA_DIR: dataDir,
      PAYGATE_API_RATE_LIMIT_PER_MINUTE: '10000000',
      PAYGATE_API_RATE_LIMIT_BURST: '10000000',
      PAYGATE_API_RATE_LIMIT_PER_KEY_PER_MINUTE: '10000000',
      PAYGATE_API_RATE_LIMIT_PER_KEY_BURST: '10000000',
    },
    [],
    gatewayNodeArgs(),
    true,
  )
  // A run that fails leaves no gateway or merchant behind, and shows what the gateway warned of last.
  let merchantProc: { kill(signal: NodeJS.Signals): boolean } | undefined
  const onExit = (code: number): void => {
    if (code)
      console.error(
        `the gateway's last warnings and errors:\n${gw.stdout
          .filter((l) => /^\{"level":"(warn|error)"/.test(l))
          .slice(-10)
          .join('\n')}`,
      )
    gw.proc.kill('SIGKILL')
    merchantProc?.kill('SIGKILL')
  }
  process.once('exit', onExit)
  const accountKey = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const info = (await call(gw.url, 'GET', '/v1/chain', accountKey)).body
  const chain = createPublicClient({ transport: http(info.rpcUrl) })
  const ledgerCount = (): Promise<bigint> => chain.readContract({ address: info.ledger, abi: paymentLedgerAbi, functionName: 'count' })
  const payTo = privateKeyToAccount(generatePrivateKey()).address

  // The merchant runs in its own process too, so the floor and the paid path cross the same process boundaries.
  const { proc: merchant, url: murl } = await spawnServer('./x402-merchant.ts', { BENCH_CHAIN_ID: String(info.chainId), BENCH_TOKEN: info.token, BENCH_PAY_TO: payTo })
  merchantProc = merchant

  for (let i = 0; i < CALLERS; i++) {
    await call(gw.url, 'POST', '/v1/agents', accountKey, { agentId: `bench${i}` })
    await call(gw.url, 'POST', '/v1/wallets', accountKey, { agentId: `bench${i}` })
  }

  const mpool = new Pool(murl, { connections: 32 })
  const apool = new Pool(gw.url, { connections: 32 })
  const plain = async (): Promise<void> => {
    const r = await mpool.request({ path: '/paid', method: 'GET' })
    await r.body.dump()
  }
  const floor = async (): Promise<void> => {
    await plain()
    await plain()
  }
  const payBody = (agent: number): string => JSON.stringify({ agentId: `bench${agent}`, endpoint: `${murl}/paid`, method: 'GET' })
  const headers = { authorization: `Bearer ${accountKey}`, 'content-type': 'application/json' }
  const payments = { n: 0 }
  const paidAs = async (agent: number): Promise<void> => {
    const r = await apool.request({ path: '/v1/pay', method: 'POST', headers, body: payBody(agent) })
    const text = await r.body.text()
    if (r.statusCode !== 200 || !text.includes('"txHash":"0x')) throw new Error(`pay failed: ${r.statusCode} ${text}`)
    payments.n++
  }
  let next = 0
  return {
    dataDir,
    gw,
    merchant,
    onExit,
    mpool,
    apool,
    ledgerCount,
    payments,
    floor,
    /** A paid call by one agent. */
    paid: (): Promise<void> => paidAs(0),
    /** A paid call by each agent in turn. */
    paidManyAgents: (): Promise<void> => paidAs(next++ % CALLERS),
  }
}

type Cpu = Record<string, number>

interface Figures {
  f: Latencies
  p: Latencies
  ft: { n: number; perSec: number }
  pt: { n: number; perSec: number }
  pm: { n: number; perSec: number }
  /** CPU ms of each process group before the floor's load (c0), after it (c1), after each paid phase (c2, c3) and after the drain (c4). */
  c: [Cpu, Cpu, Cpu, Cpu, Cpu]
  /** The gateway's main thread's CPU ms before the paid phases (m1) and after each (m2, m3). */
  m: [number, number, number]
  paidBefore: number
  drained: boolean
  drainMs: number
}

/** Warm up, time sequential calls, load with 16 callers (the floor, one agent, 16 agents), and wait for the chain to count every payment. */
async function measure(s: Setup, opts: { sequential: number; concurrent: number; maxMs: number }): Promise<Figures> {
  // Warm up both paths until they are steady: after 200 calls the next 500 pairs were still
  // +1.21 ms over a floor of 0.46 ms, settling near +0.75..0.85 ms over 0.25 ms after ~1,500
  // (JIT in all three processes, pools, caches; the floor moves as much as the paid path).
  await timeAlternating(2000, 20_000, s.floor, s.paid)

  // Floor and paid calls alternate, so both series see the same moments of the machine.
  const [f, p] = await timeAlternating(opts.sequential, 2 * opts.maxMs, s.floor, s.paid)
  // CPU time of each process per call, from /proc: where the cores go, and how many a rate needs.
  const pid = s.gw.proc.pid!
  const procs = { gateway: [pid], chain: descendants(pid), merchant: [s.merchant.pid!], callers: 'self' as const }
  // The gateway's main thread alone: what a paid call's latency waits on (its other threads: the embedded chain's, ledger signing, V8's, libuv's).
  const mainThread = (): number => threadCpuMs(pid, pid)
  const c0 = cpuTimes(procs)
  const ft = await throughput(16, opts.concurrent, opts.maxMs, s.floor)
  const c1 = cpuTimes(procs)
  const m1 = mainThread()
  const paidBefore = s.payments.n
  const pt = await throughput(16, opts.concurrent, opts.maxMs, s.paid)
  const c2 = cpuTimes(procs)
  const m2 = mainThread()
  const pm = await throughput(16, opts.concurrent, opts.maxMs, s.paidManyAgents)
  const c3 = cpuTimes(procs)
  const m3 = mainThread()
  const drainStart = Date.now()
  let drained = false
  while (Date.now() - drainStart < 180_000) {
    if ((await s.ledgerCount()) >= BigInt(s.payments.n)) {
      drained = true
      break
    }
    await new Promise((r) => setTimeout(r, 250))
  }
  const drainMs = Date.now() - drainStart
  return { f, p, ft, pt, pm, c: [c0, c1, c2, c3, cpuTimes(procs)], m: [m1, m2, m3], paidBefore, drained, drainMs }
}

function report(x: Figures, payments: number): void {
  const { f, p, ft, pt, pm, drained, drainMs, paidBefore } = x
  const [c0, c1, c2, c3, c4] = x.c
  const [m1, m2, m3] = x.m
  console.log('\n== paid POST /v1/pay vs floor (two plain round trips to the same merchant; sequential calls alternate floor and paid) ==')
  console.log(`sequential: floor p50 ${fmt(f.p50, 3)} ms p99 ${fmt(f.p99, 3)} ms (n=${f.n}); paid p50 ${fmt(p.p50, 3)} ms p99 ${fmt(p.p99, 3)} ms (n=${p.n})`)
  console.log(`ratio paid/floor: p50 ${fmt(p.p50 / f.p50)}x (+${fmt(p.p50 - f.p50, 3)} ms), p99 ${fmt(p.p99 / f.p99)}x (+${fmt(p.p99 - f.p99, 3)} ms)`)
  console.log(`16 callers: floor ${fmt(ft.perSec, 0)} pairs/s (n=${ft.n})`)
  console.log(`  one agent: ${fmt(pt.perSec, 0)} paid/s (n=${pt.n}); ratio to floor ${fmt(pt.perSec / ft.perSec)}x`)
  console.log(`  16 agents: ${fmt(pm.perSec, 0)} paid/s (n=${pm.n}); ratio to floor ${fmt(pm.perSec / ft.perSec)}x`)
  console.log(`ledger: all ${payments} payments counted by the contract: ${drained} (${drainMs} ms after the last payment)`)
  const cpuFloor = cpuPerCall(c0, c1, ft.n)
  const cpuOne = cpuPerCall(c1, c2, pt.n)
  const cpuMany = cpuPerCall(c2, c3, pm.n)
  // The chain's share is taken over both paid phases and the drain after them: it records each payment on its own time.
  const chainMs = (c4.chain! - c1.chain!) / (payments - paidBefore)
  const rest = cpuMany.total - (c3.chain! - c2.chain!) / pm.n
  console.log('CPU ms per call, from /proc (all threads of each process):')
  console.log(`  floor pair: ${cpuFloor.text}; total ${fmt(cpuFloor.total, 3)}`)
  console.log(`  paid, one agent: ${cpuOne.text}; total ${fmt(cpuOne.total, 3)} (${fmt(cpuOne.total / cpuFloor.total)}x the floor pair)`)
  console.log(`  paid, 16 agents: ${cpuMany.text}; total ${fmt(cpuMany.total, 3)} (${fmt(cpuMany.total / cpuFloor.total)}x the floor pair)`)
  console.log(
    `  of the gateway's, its main thread: one agent ${fmt((m2 - m1) / pt.n, 3)}, 16 agents ${fmt((m3 - m2) / pm.n, 3)} (the rest: the embedded chain's and the ledger signing threads, V8's, libuv's)`,
  )
  console.log(`  the chain per ledger record over both paid phases and the drain: ${fmt(chainMs, 3)}`)
  console.log(
    `  at these costs (16 agents, the chain's over the drain too) 2,000 paid/s needs ${fmt((2000 * (rest + chainMs)) / 1000, 1)} cores: ` +
      `gateway ${fmt((2000 * ((c3.gateway! - c2.gateway!) / pm.n)) / 1000, 1)}, chain ${fmt((2000 * chainMs) / 1000, 1)}; this machine has ${availableParallelism()}`,
  )
  // What any gateway would need on top of its own cost: the chain, the merchant and the callers alone.
  const others = chainMs + (c3.merchant! - c2.merchant!) / pm.n + (c3.callers! - c2.callers!) / pm.n
  console.log(`  the chain, the merchant and the callers alone (a gateway costing nothing) need ${fmt((2000 * others) / 1000, 1)} cores at 2,000 paid/s`)
}

/**
 * A crash with all of the above behind it, and the start after it timed: the chain comes back
 * from its last snapshot and the journal since, LevelDB from its write-ahead log.
 */
async function restartAfterKill(s: Setup): Promise<void> {
  await s.gw.stop('SIGKILL')
  const t0 = performance.now()
  const again = await spawnGateway({ PAYGATE_DATA_DIR: s.dataDir }, [], [], true)
  const ms = performance.now() - t0
  const chainReady = again.stdout.find((l) => l.includes('"embedded chain ready"'))
  const c = chainReady ? (JSON.parse(chainReady) as Record<string, unknown>) : {}
  console.log(
    `start-up after a SIGKILL holding ${s.payments.n} ledger records: ${fmt(ms, 0)} ms, ${fmt(ms / 5000)}x the 5 s budget ` +
      `(chain: snapshot loaded in ${String(c.loadMs)} ms, ${String(c.replayed)} journal entries replayed in ${String(c.replayMs)} ms)`,
  )
  await again.stop()
}
