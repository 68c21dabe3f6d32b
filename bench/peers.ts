/**
 * wrk (a separate load generator) against a trivial loopback target (its own process): direct, through
 * Paygate (absolute-form, identity checked on every request), and through the peer proxies
 * whose Debian packages are installed (tinyproxy, squid, mitmproxy). Every line comes from
 * the same run. Missing tools are reported and skipped (apt-get install wrk tinyproxy squid mitmproxy).
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { chmodSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import { availableParallelism } from 'node:os'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { tempDir } from '../test/helpers/gateway.js'
import { call, spawnGateway } from '../test/helpers/process.js'
import { fmt, gatewayNodeArgs, spawnServer } from './lib.js'

const run = promisify(execFile)
const has = async (bin: string): Promise<boolean> =>
  run('sh', ['-c', `command -v ${bin}`]).then(
    () => true,
    () => false,
  )

interface WrkResult {
  rps: number
  requests: number
  p50: string
  p99: string
  /** CPU time the contender's processes spent per request, in µs (null where /proc cannot tell). */
  cpuUs: number | null
}

let ticks: Promise<number> | undefined
const clockTicks = (): Promise<number> =>
  (ticks ??= run('getconf', ['CLK_TCK']).then(
    (r) => Number(r.stdout.trim()) || 100,
    () => 100,
  ))

/** CPU time (user + system, ms) of a process and every process below it, from /proc; null off Linux. */
async function treeCpuMs(pid: number): Promise<number | null> {
  const hz = await clockTicks()
  const walk = (p: number): number => {
    const stat = readFileSync(`/proc/${p}/stat`, 'utf8')
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    let ms = ((Number(f[11]) + Number(f[12])) * 1000) / hz
    for (const t of readdirSync(`/proc/${p}/task`)) {
      for (const c of readFileSync(`/proc/${p}/task/${t}/children`, 'utf8').split(' ').filter(Boolean)) ms += walk(Number(c))
    }
    return ms
  }
  try {
    return walk(pid)
  } catch {
    return null
  }
}

/**
 * CPU placement: with two or more cores and taskset, the load side (wrk, the target) runs on
 * CPU 0 and each proxy on CPU 1, one core apiece (squid runs with `workers 1`). Left to the
 * scheduler, the same build moved by up to 30% between runs here, by where it was placed.
 */
const LOAD_CPU = 0
const PROXY_CPU = 1
let pinning: Promise<boolean> | undefined
const canPin = (): Promise<boolean> => (pinning ??= availableParallelism() >= 2 ? has('taskset') : Promise.resolve(false))
/** `cmd args` to run on `cpu` (as is when pinning is not available). */
async function onCpu(cpu: number, cmd: string, args: string[]): Promise<[string, string[]]> {
  return (await canPin()) ? ['taskset', ['-c', String(cpu), cmd, ...args]] : [cmd, args]
}
/** Move a running process (every thread) to `cpu`. */
async function pin(pid: number | undefined, cpu: number): Promise<void> {
  if (pid !== undefined && (await canPin())) await run('taskset', ['-a', '-cp', String(cpu), String(pid)])
}

/** The measured run, after a 2 s warm-up (JIT, connection pools, caches) when `warm`. */
async function wrk(url: string, script: string | null, seconds: number, warm = true, pid?: number): Promise<WrkResult> {
  const opts = (secs: number): string[] => ['-t1', '-c10', `-d${secs}s`, '--latency', ...(script ? ['-s', script] : []), url]
  if (warm) await run(...(await onCpu(LOAD_CPU, 'wrk', opts(2))), { timeout: 30_000 })
  const cpu0 = pid === undefined ? null : await treeCpuMs(pid)
  const { stdout } = await run(...(await onCpu(LOAD_CPU, 'wrk', opts(seconds))), { timeout: (seconds + 20) * 1000 })
  const cpu1 = pid === undefined ? null : await treeCpuMs(pid)
  const requests = Number(/(\d+) requests in/.exec(stdout)?.[1] ?? NaN)
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(stdout)?.[1] ?? NaN)
  const p50 = /\s50%\s+(\S+)/.exec(stdout)?.[1] ?? '?'
  const p99 = /\s99%\s+(\S+)/.exec(stdout)?.[1] ?? '?'
  return { rps, requests, p50, p99, cpuUs: cpu0 !== null && cpu1 !== null ? ((cpu1 - cpu0) * 1000) / requests : null }
}

async function waitPort(port: number, ms: number): Promise<void> {
  const end = Date.now() + ms
  while (Date.now() < end) {
    const ok = await fetch(`http://127.0.0.1:${port}/`).then(
      () => true,
      () => false,
    )
    if (ok) return
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`nothing listening on ${port}`)
}

const freePort = async (): Promise<number> => {
  const s = createServer()
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r))
  const p = (s.address() as AddressInfo).port
  await new Promise<void>((r) => s.close(() => r()))
  return p
}

export interface PeerProxy {
  url: string
  /** The CA a client must trust for intercepted HTTPS. */
  ca: string
  pid?: number
  stop(): Promise<void>
}

/**
 * mitmdump, the reference for TLS interception, verifying upstream TLS against `upstreamCa`
 * as Paygate does, on `cpu` when given; null (and a line saying why) when it is not installed or does not start.
 */
export async function startMitmproxy(dir: string, upstreamCa: string | null, cpu?: number): Promise<PeerProxy | null> {
  if (!(await has('mitmdump'))) {
    console.log('mitmproxy not installed (apt-get install mitmproxy): skipped')
    return null
  }
  const port = await freePort()
  const confdir = join(dir, 'mitmproxy')
  mkdirSync(confdir, { recursive: true })
  const args = ['-q', '--listen-host', '127.0.0.1', '-p', String(port), '--set', `confdir=${confdir}`, ...(upstreamCa ? ['--set', `ssl_verify_upstream_trusted_ca=${upstreamCa}`] : [])]
  const [cmd, argv] = cpu === undefined ? ['mitmdump', args] : await onCpu(cpu, 'mitmdump', args)
  const c = spawn(cmd, argv, { stdio: 'ignore' })
  try {
    await waitPort(port, 20_000)
  } catch (e) {
    await stopChild(c)
    console.log(`mitmproxy did not start here: ${(e as Error).message}`)
    return null
  }
  return { url: `http://127.0.0.1:${port}`, ca: readFileSync(join(confdir, 'mitmproxy-ca-cert.pem'), 'utf8'), ...(c.pid !== undefined ? { pid: c.pid } : {}), stop: () => stopChild(c) }
}

async function stopChild(c: ChildProcess): Promise<void> {
  if (c.exitCode !== null || c.signalCode !== null) return
  const exited = new Promise((r) => c.once('exit', r))
  c.kill('SIGTERM')
  const t = setTimeout(() => c.kill('SIGKILL'), 3000)
  await exited
  clearTimeout(t)
}

/** One proxy under test: where wrk sends its requests, with which script, and how to stop it. */
interface Contender {
  name: string
  url: string
  script: string | null
  /** The proxy's process, for its CPU time per request. */
  pid?: number
  stop(): Promise<void>
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

/**
 * Every proxy is started first, then measured in interleaved rounds (direct, each proxy,
 * again; every other round in reverse order): a busy moment on the machine then touches
 * the contenders of a round alike, and each ratio is the median of the per-round ratios.
 */
export async function benchPeers(seconds = 5, rounds = 4): Promise<void> {
  console.log(
    `\n== plain HTTP passthrough with wrk (1 thread, 10 connections; ${rounds} interleaved rounds of ${seconds} s${(await canPin()) ? `; load on CPU ${LOAD_CPU}, each proxy on CPU ${PROXY_CPU}` : ''}) ==`,
  )
  if (!(await has('wrk'))) {
    console.log('wrk is not installed (apt-get install wrk): skipped')
    return
  }
  const dir = tempDir('paygate-bench-peers-')
  chmodSync(dir, 0o777)
  // The target runs in its own process: this one also drains Paygate's log pipe.
  const { proc: target, url: targetUrl } = await spawnServer('./ok-target.ts')
  await pin(target.pid, LOAD_CPU)
  const proxyScript = (auth: string | null): string => {
    const f = join(dir, `abs-${auth ? 'auth' : 'plain'}.lua`)
    writeFileSync(f, `wrk.path = "${targetUrl}"\n${auth ? `wrk.headers["Proxy-Authorization"] = "${auth}"\n` : ''}`)
    return f
  }
  // Each contender is added as soon as it runs, so that a failure further on still stops it.
  const contenders: Contender[] = []
  try {
    contenders.push({ name: 'direct', url: targetUrl, script: null, pid: target.pid, stop: async () => {} })
    await startPaygates(dir, proxyScript, contenders)
    await startTinyproxy(dir, proxyScript, contenders)
    await startSquids(dir, proxyScript, contenders)
    const mitm = await startMitmproxy(dir, null, PROXY_CPU)
    if (mitm) contenders.push({ name: 'mitmproxy', url: mitm.url, script: proxyScript(null), pid: mitm.pid, stop: () => mitm.stop() })
    report(contenders, await measureRounds(contenders, rounds, seconds))
  } finally {
    for (const c of contenders) await c.stop()
    await stopChild(target)
    rmSync(dir, { recursive: true, force: true })
  }
}

/** The wrk script that sends absolute-form requests for the target through a proxy, with `auth` as Proxy-Authorization where given. */
type ProxyScript = (auth: string | null) => string

/**
 * Paygate writes one access-log line per proxied request by default (proxy.accessLog);
 * squid's default config logs each request too. Both run with their access log (the
 * defaults) and without it (PAYGATE_PROXY_ACCESS_LOG=false, squid `access_log none`).
 */
async function startPaygates(dir: string, proxyScript: ProxyScript, contenders: Contender[]): Promise<void> {
  for (const accessLog of [true, false]) {
    const data = join(dir, `data-${accessLog ? 'log' : 'nolog'}`)
    const gw = await spawnGateway({ PAYGATE_DATA_DIR: data, PAYGATE_LOG_LEVEL: 'info', PAYGATE_PROXY_ACCESS_LOG: String(accessLog) }, [], gatewayNodeArgs(), false)
    const stop = (): Promise<void> => gw.stop('SIGTERM').then(() => {})
    try {
      await pin(gw.proc.pid, PROXY_CPU)
      const acct = readFileSync(join(data, 'account-key'), 'utf8').trim()
      const key = (await call(gw.url, 'POST', '/v1/agents', acct, { agentId: 'bench' })).body.apiKey as string
      const url = gw.stdout.map((l) => JSON.parse(l)).find((j) => j.msg === 'paygate started').proxy as string
      contenders.push({ name: `Paygate (${accessLog ? 'access log' : 'no log'})`, url, script: proxyScript(`Basic ${Buffer.from(`bench:${key}`).toString('base64')}`), pid: gw.proc.pid, stop })
    } catch (e) {
      await stop()
      throw e
    }
  }
}

async function startTinyproxy(dir: string, proxyScript: ProxyScript, contenders: Contender[]): Promise<void> {
  if (await has('tinyproxy')) {
    const port = await freePort()
    const conf = join(dir, 'tinyproxy.conf')
    writeFileSync(conf, `Port ${port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 200\nLogLevel Critical\nAllow 127.0.0.1\n`)
    const c = spawn(...(await onCpu(PROXY_CPU, 'tinyproxy', ['-d', '-c', conf])), { stdio: 'ignore' })
    contenders.push({ name: 'tinyproxy', url: `http://127.0.0.1:${port}`, script: proxyScript(null), pid: c.pid, stop: () => stopChild(c) })
    await waitPort(port, 5000)
  } else console.log('tinyproxy not installed (apt-get install tinyproxy): skipped')
}

/** squid with its access log and without it (see startPaygates). */
async function startSquids(dir: string, proxyScript: ProxyScript, contenders: Contender[]): Promise<void> {
  if (await has('squid')) {
    for (const accessLog of [true, false]) {
      const port = await freePort()
      const sdir = join(dir, `squid-${accessLog ? 'log' : 'nolog'}`)
      mkdirSync(sdir, { recursive: true, mode: 0o777 })
      chmodSync(sdir, 0o777)
      const conf = join(sdir, 'squid.conf')
      // `daemon:` is squid's default access-log module (a helper process writes the file).
      const log = accessLog ? `access_log daemon:${sdir}/access.log squid` : 'access_log none'
      writeFileSync(
        conf,
        `http_port 127.0.0.1:${port}\nhttp_access allow all\ncache deny all\n${log}\ncache_log /dev/null\ncache_store_log none\npid_filename ${sdir}/squid.pid\ncoredump_dir ${sdir}\nworkers 1\nshutdown_lifetime 0 seconds\n`,
      )
      const c = spawn(...(await onCpu(PROXY_CPU, 'squid', ['-N', '-f', conf])), { stdio: 'ignore' })
      const squid = { name: `squid (${accessLog ? 'access log' : 'no log'})`, url: `http://127.0.0.1:${port}`, script: proxyScript(null), pid: c.pid, stop: () => stopChild(c) }
      try {
        await waitPort(port, 10_000)
        contenders.push(squid)
      } catch (e) {
        await squid.stop()
        console.log(`squid did not start here: ${(e as Error).message}`)
      }
    }
  } else console.log('squid not installed (apt-get install squid): skipped')
}

/** Every contender's wrk runs, by name, round after round; the first round warms each up. */
async function measureRounds(contenders: Contender[], rounds: number, seconds: number): Promise<Map<string, WrkResult[]>> {
  const runs = new Map<string, WrkResult[]>(contenders.map((c) => [c.name, []]))
  // Odd rounds run in reverse order, so no contender always follows the same one.
  for (let r = 0; r < rounds; r++) {
    for (const c of r % 2 ? [...contenders].reverse() : contenders) runs.get(c.name)!.push(await wrk(c.url, c.script, seconds, r === 0, c.pid))
  }
  return runs
}

/** A line per contender (medians over the rounds), then Paygate's ratio to each peer proxy. */
function report(contenders: Contender[], runs: Map<string, WrkResult[]>): void {
  const rps = (name: string): number[] => runs.get(name)?.map((w) => w.rps) ?? []
  const cpu = (name: string): number[] => (runs.get(name) ?? []).flatMap((w) => (w.cpuUs === null ? [] : [w.cpuUs]))
  const direct = median(rps('direct'))
  for (const c of contenders) {
    const all = runs.get(c.name)!
    const mid = median(all.map((w) => w.rps))
    // Latencies are those of the round nearest the median rate.
    const near = all.reduce((a, w) => (Math.abs(w.rps - mid) < Math.abs(a.rps - mid) ? w : a))
    const us = cpu(c.name)
    console.log(
      `${c.name.padEnd(22)} ${fmt(mid, 0).padStart(7)} req/s  p50 ${near.p50}  p99 ${near.p99}  ${us.length ? `${fmt(median(us), 1)} µs CPU/req  ` : ''}(${fmt(mid / direct)}x direct; rounds ${all.map((w) => fmt(w.rps / 1000, 1)).join(', ')}k)`,
    )
  }
  const ratio = (label: string, a: string, b: string): void => {
    const x = rps(a)
    const y = rps(b)
    if (!x.length || !y.length) return
    const per = x.map((v, i) => v / y[i]!)
    const [ca, cb] = [cpu(a), cpu(b)]
    const cpuRatio = ca.length && cb.length ? `; CPU per request ${fmt(median(cb) / median(ca))}x less` : ''
    console.log(`Paygate / ${label}: ${fmt(median(per))}x the requests/s (rounds ${per.map((v) => fmt(v)).join(', ')})${cpuRatio}`)
  }
  ratio('squid, both with access logs', 'Paygate (access log)', 'squid (access log)')
  ratio('squid, both without access logs', 'Paygate (no log)', 'squid (no log)')
  ratio('tinyproxy', 'Paygate (access log)', 'tinyproxy')
  ratio('mitmproxy', 'Paygate (access log)', 'mitmproxy')
}
