/**
 * `BENCH_AB_BASE=<another checkout> npm run bench pay-ab`: the gateway CPU per paid call of
 * two trees (the other checkout, with its own node_modules, and this one), each with its
 * own gateway, embedded chain and merchant, measured in alternating windows of calls, so
 * both see the same moments of a shared machine (whole runs of one tree may differ by 2x
 * there). Prints the min, quartile and median of the per-window figures, and each tree's CPU
 * over the whole run (all threads, and the main thread), which also counts what a window's
 * calls leave to do after it (LevelDB is written a second behind the log). Then the paid
 * latency of both, one call to each in turn (BENCH_AB_LATENCY calls each, 2,000).
 * BENCH_AB_ROUNDS and BENCH_AB_CALLS set the rounds (12) and the calls a window (200).
 * BENCH_AB_NODE_ARGS_BASE and BENCH_AB_NODE_ARGS_THIS add Node flags to one side's gateway
 * (space-separated), so one tree can be compared with itself under other V8 settings.
 */
import { readFileSync, rmSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { Pool } from 'undici'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { tempDir } from '../test/helpers/gateway.js'
import { call, spawnGateway } from '../test/helpers/process.js'
import { cpuTimes, fmt, gatewayNodeArgs, spawnServer, threadCpuMs, throughput, timeAlternating } from './lib.js'

type Spawn = typeof spawnGateway
const ENV = {
  PAYGATE_API_RATE_LIMIT_PER_MINUTE: '10000000',
  PAYGATE_API_RATE_LIMIT_BURST: '10000000',
  PAYGATE_API_RATE_LIMIT_PER_KEY_PER_MINUTE: '10000000',
  PAYGATE_API_RATE_LIMIT_PER_KEY_BURST: '10000000',
}
const AGENTS = 16

/** One tree's gateway with 16 funded agents and its own merchant; `window(k)` is its CPU ms per paid call over `calls` calls by `k` callers. */
async function side(spawn: Spawn, payTo: string, calls: number, nodeArgs = '') {
  const dataDir = tempDir('paygate-ab-')
  const gw = await spawn({ PAYGATE_DATA_DIR: dataDir, ...ENV }, [], gatewayNodeArgs(nodeArgs), false)
  const key = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const info = (await call(gw.url, 'GET', '/v1/chain', key)).body
  const { proc: merchant, url: murl } = await spawnServer('./x402-merchant.ts', { BENCH_CHAIN_ID: String(info.chainId), BENCH_TOKEN: info.token, BENCH_PAY_TO: payTo })
  for (let i = 0; i < AGENTS; i++) {
    await call(gw.url, 'POST', '/v1/agents', key, { agentId: `bench${i}` })
    await call(gw.url, 'POST', '/v1/wallets', key, { agentId: `bench${i}` })
  }
  const pool = new Pool(gw.url, { connections: 32 })
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' }
  let next = 0
  const paid = async (): Promise<void> => {
    const body = JSON.stringify({ agentId: `bench${next++ % AGENTS}`, endpoint: `${murl}/paid`, method: 'GET' })
    const r = await pool.request({ path: '/v1/pay', method: 'POST', headers, body })
    const text = await r.body.text()
    if (r.statusCode !== 200) throw new Error(`pay failed: ${r.statusCode} ${text}`)
  }
  return {
    paid,
    async window(callers: number): Promise<number> {
      const c0 = cpuTimes({ g: [gw.proc.pid!] })
      const t = await throughput(callers, calls, 60_000, paid)
      return ((cpuTimes({ g: [gw.proc.pid!] }).g! - c0.g!) / t.n) as number
    },
    /** CPU ms used so far: all threads, the main thread. */
    cpu(): [number, number] {
      return [cpuTimes({ g: [gw.proc.pid!] }).g!, threadCpuMs(gw.proc.pid!, gw.proc.pid!)]
    },
    async stop(): Promise<void> {
      await pool.close()
      merchant.kill('SIGTERM')
      await gw.stop('SIGTERM', 120_000)
      rmSync(dataDir, { recursive: true, force: true })
    },
  }
}

const quantile = (xs: number[], q: number): string => fmt([...xs].sort((a, b) => a - b)[Math.floor(q * (xs.length - 1))]!, 3)

export async function benchPayAb(opts: { rounds: number; calls: number }): Promise<void> {
  const baseDir = process.env.BENCH_AB_BASE
  if (!baseDir) throw new Error('pay-ab needs BENCH_AB_BASE=<the checkout to compare with>')
  const { spawnGateway: spawnBase } = (await import(resolve(baseDir, 'test/helpers/process.ts'))) as { spawnGateway: Spawn }
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  // Both trees run from their sources, alike (the other checkout's build may be stale or absent).
  const built = process.env.PAYGATE_SPAWN_BUILT
  delete process.env.PAYGATE_SPAWN_BUILT
  const sides = {
    base: await side(spawnBase, payTo, opts.calls, process.env.BENCH_AB_NODE_ARGS_BASE),
    this: await side(spawnGateway, payTo, opts.calls, process.env.BENCH_AB_NODE_ARGS_THIS),
  }
  if (built !== undefined) process.env.PAYGATE_SPAWN_BUILT = built
  for (const s of Object.values(sides)) await throughput(4, 1500, 60_000, s.paid) // warm-up: JIT, pools, caches
  await new Promise((r) => setTimeout(r, 3000)) // what the warm-up left to write
  const start = { base: sides.base.cpu(), this: sides.this.cpu() }
  const got = { base: { one: [] as number[], many: [] as number[] }, this: { one: [] as number[], many: [] as number[] } }
  for (let r = 0; r < opts.rounds; r++) {
    // Every other round in reverse order: neither tree always goes first.
    const order = (r % 2 ? ['base', 'this'] : ['this', 'base']) as (keyof typeof sides)[]
    for (const k of order) got[k].one.push(await sides[k].window(1))
    for (const k of order) got[k].many.push(await sides[k].window(16))
  }
  await new Promise((r) => setTimeout(r, 3000)) // what the last windows left to write
  const calls = 2 * opts.rounds * opts.calls
  console.log(`\n== gateway CPU ms per paid call, ${opts.rounds} alternating windows of ${opts.calls} calls (base: ${baseDir}) ==`)
  for (const k of ['base', 'this'] as const) {
    const [all, main] = sides[k].cpu()
    console.log(`${k.padEnd(5)} whole run (${calls} calls, then 3 s idle): all threads ${fmt((all - start[k][0]) / calls, 3)}, main thread ${fmt((main - start[k][1]) / calls, 3)}`)
  }
  for (const [k, g] of Object.entries(got)) {
    console.log(
      `${k.padEnd(5)} sequential: min ${quantile(g.one, 0)} p25 ${quantile(g.one, 0.25)} median ${quantile(g.one, 0.5)}; 16 callers: min ${quantile(g.many, 0)} p25 ${quantile(g.many, 0.25)} median ${quantile(g.many, 0.5)}`,
    )
  }
  const [b, n] = await timeAlternating(Number(process.env.BENCH_AB_LATENCY ?? 2000), 120_000, sides.base.paid, sides.this.paid)
  console.log(`paid latency, one call to each in turn (n=${b.n}): base p50 ${fmt(b.p50, 3)} ms p99 ${fmt(b.p99, 3)} ms; this p50 ${fmt(n.p50, 3)} ms p99 ${fmt(n.p99, 3)} ms`)
  for (const s of Object.values(sides)) await s.stop()
}
