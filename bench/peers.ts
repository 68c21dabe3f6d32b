/**
 * wrk (a separate load generator) against a trivial loopback target (its own process): direct, through
 * Paygate (absolute-form, identity checked on every request), and through the peer proxies
 * whose Debian packages are installed (tinyproxy, squid, mitmproxy). Every line comes from
 * the same run. Missing tools are reported and skipped (apt-get install wrk tinyproxy squid mitmproxy).
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { tempDir } from '../test/helpers/gateway.js'
import { call, spawnGateway } from '../test/helpers/process.js'
import { fmt, gatewayNodeArgs, spawnServer } from './lib.js'

const run = promisify(execFile)
const has = async (bin: string): Promise<boolean> => run('sh', ['-c', `command -v ${bin}`]).then(() => true, () => false)

interface WrkResult {
  rps: number
  p50: string
  p99: string
}

/** A 2 s warm-up (JIT, connection pools, caches), then the measured run. */
async function wrk(url: string, script: string | null, seconds: number): Promise<WrkResult> {
  await run('wrk', ['-t1', '-c10', '-d2s', ...(script ? ['-s', script] : []), url], { timeout: 30_000 })
  const args = ['-t1', '-c10', `-d${seconds}s`, '--latency', ...(script ? ['-s', script] : []), url]
  const { stdout } = await run('wrk', args, { timeout: (seconds + 20) * 1000 })
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(stdout)?.[1] ?? NaN)
  const p50 = /\s50%\s+(\S+)/.exec(stdout)?.[1] ?? '?'
  const p99 = /\s99%\s+(\S+)/.exec(stdout)?.[1] ?? '?'
  return { rps, p50, p99 }
}

async function waitPort(port: number, ms: number): Promise<void> {
  const end = Date.now() + ms
  while (Date.now() < end) {
    const ok = await fetch(`http://127.0.0.1:${port}/`).then(() => true, () => false)
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
  stop(): Promise<void>
}

/**
 * mitmdump, the reference for TLS interception, verifying upstream TLS against `upstreamCa`
 * as Paygate does; null (and a line saying why) when it is not installed or does not start.
 */
export async function startMitmproxy(dir: string, upstreamCa: string | null): Promise<PeerProxy | null> {
  if (!(await has('mitmdump'))) {
    console.log('mitmproxy not installed (apt-get install mitmproxy): skipped')
    return null
  }
  const port = await freePort()
  const confdir = join(dir, 'mitmproxy')
  mkdirSync(confdir, { recursive: true })
  const args = ['-q', '--listen-host', '127.0.0.1', '-p', String(port), '--set', `confdir=${confdir}`, ...(upstreamCa ? ['--set', `ssl_verify_upstream_trusted_ca=${upstreamCa}`] : [])]
  const c = spawn('mitmdump', args, { stdio: 'ignore' })
  try {
    await waitPort(port, 20_000)
  } catch (e) {
    await stopChild(c)
    console.log(`mitmproxy did not start here: ${(e as Error).message}`)
    return null
  }
  return { url: `http://127.0.0.1:${port}`, ca: readFileSync(join(confdir, 'mitmproxy-ca-cert.pem'), 'utf8'), stop: () => stopChild(c) }
}

async function stopChild(c: ChildProcess): Promise<void> {
  if (c.exitCode !== null || c.signalCode !== null) return
  const exited = new Promise((r) => c.once('exit', r))
  c.kill('SIGTERM')
  const t = setTimeout(() => c.kill('SIGKILL'), 3000)
  await exited
  clearTimeout(t)
}

export async function benchPeers(seconds = 5): Promise<void> {
  console.log('\n== plain HTTP passthrough with wrk (1 thread, 10 connections) ==')
  if (!(await has('wrk'))) {
    console.log('wrk is not installed (apt-get install wrk): skipped')
    return
  }
  const dir = tempDir('paygate-bench-peers-')
  chmodSync(dir, 0o777)
  // The target runs in its own process: this one also drains Paygate's log pipe.
  const { proc: target, url: targetUrl } = await spawnServer('./ok-target.ts')
  const proxyScript = (auth: string | null): string => {
    const f = join(dir, `abs-${auth ? 'auth' : 'plain'}.lua`)
    writeFileSync(f, `wrk.path = "${targetUrl}"\n${auth ? `wrk.headers["Proxy-Authorization"] = "${auth}"\n` : ''}`)
    return f
  }
  const children: ChildProcess[] = []
  try {
    const direct = await wrk(targetUrl, null, seconds)
    const line = (name: string, r: WrkResult): void =>
      console.log(`${name.padEnd(22)} ${fmt(r.rps, 0).padStart(7)} req/s  p50 ${r.p50}  p99 ${r.p99}  (${fmt(r.rps / direct.rps)}x direct)`)
    line('direct', direct)

    const gw = await spawnGateway({ PAYGATE_DATA_DIR: join(dir, 'data'), PAYGATE_LOG_LEVEL: 'info' }, [], gatewayNodeArgs(), false)
    const acct = readFileSync(join(dir, 'data', 'account-key'), 'utf8').trim()
    const key = (await call(gw.url, 'POST', '/v1/agents', acct, { agentId: 'bench' })).body.apiKey as string
    const proxyUrl = gw.stdout.map((l) => JSON.parse(l)).find((j) => j.msg === 'paygate started').proxy as string
    let paygate: WrkResult
    try {
      paygate = await wrk(proxyUrl, proxyScript(`Basic ${Buffer.from(`bench:${key}`).toString('base64')}`), seconds)
    } finally {
      await gw.stop('SIGTERM')
    }
    line('Paygate', paygate)

    const peers: Record<string, number> = {}
    if (await has('tinyproxy')) {
      const port = await freePort()
      const conf = join(dir, 'tinyproxy.conf')
      writeFileSync(conf, `Port ${port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 200\nLogLevel Critical\nAllow 127.0.0.1\n`)
      const c = spawn('tinyproxy', ['-d', '-c', conf], { stdio: 'ignore' })
      children.push(c)
      await waitPort(port, 5000)
      const r = await wrk(`http://127.0.0.1:${port}`, proxyScript(null), seconds)
      line('tinyproxy', r)
      peers.tinyproxy = r.rps
      await stopChild(c)
    } else console.log('tinyproxy not installed (apt-get install tinyproxy): skipped')
    if (await has('squid')) {
      const port = await freePort()
      const sdir = join(dir, 'squid')
      mkdirSync(sdir, { recursive: true, mode: 0o777 })
      chmodSync(sdir, 0o777)
      const conf = join(sdir, 'squid.conf')
      writeFileSync(
        conf,
        `http_port 127.0.0.1:${port}\nhttp_access allow all\ncache deny all\naccess_log none\ncache_log /dev/null\ncache_store_log none\npid_filename ${sdir}/squid.pid\ncoredump_dir ${sdir}\nworkers 1\nshutdown_lifetime 0 seconds\n`,
      )
      const c = spawn('squid', ['-N', '-f', conf], { stdio: 'ignore' })
      children.push(c)
      try {
        await waitPort(port, 10_000)
        const r = await wrk(`http://127.0.0.1:${port}`, proxyScript(null), seconds)
        line('squid', r)
        peers.squid = r.rps
      } catch (e) {
        console.log(`squid did not start here: ${(e as Error).message}`)
      }
      await stopChild(c)
    } else console.log('squid not installed (apt-get install squid): skipped')
    const mitm = await startMitmproxy(dir, null)
    if (mitm) {
      try {
        const r = await wrk(mitm.url, proxyScript(null), seconds)
        line('mitmproxy', r)
        peers.mitmproxy = r.rps
      } finally {
        await mitm.stop()
      }
    }
    for (const [name, rps] of Object.entries(peers)) console.log(`Paygate / ${name}: ${fmt(paygate.rps / rps)}x`)
  } finally {
    for (const c of children) await stopChild(c)
    await stopChild(target)
    rmSync(dir, { recursive: true, force: true })
  }
}
