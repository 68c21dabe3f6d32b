/**
 * Passthrough through the proxy vs direct, in the same run: plain HTTP (absolute-form),
 * HTTPS keep-alive with interception (one CONNECT, many requests), and new CONNECT + TLS
 * handshakes per second. Paygate runs as its own process; the target and the clients here.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { createServer as createHttpsServer } from 'node:https'
import { readFileSync, rmSync } from 'node:fs'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { connect as tlsConnect } from 'node:tls'
import { request as httpRequest } from 'node:http'
import { Agent, Pool, ProxyAgent, request } from 'undici'
import { CertificateAuthority } from '../src/proxy/ca.js'
import { tempDir } from '../test/helpers/gateway.js'
import { call, spawnGateway } from '../test/helpers/process.js'
import { fmt, gatewayNodeArgs, throughput, timeSequential, type Latencies } from './lib.js'
import { startMitmproxy } from './peers.js'

export async function benchProxy(opts: { count: number; maxMs: number }): Promise<void> {
  const dir = tempDir('paygate-bench-proxy-')
  const t = await startTargets(dir)
  const gw = await spawnGateway({ PAYGATE_DATA_DIR: join(dir, 'data'), PAYGATE_UPSTREAM_CA_FILE: t.caFile }, [], gatewayNodeArgs(), false)
  try {
    const p = await proxyAccess(gw, dir)
    const dispatchers = await measurePassthrough(t, p, dir, opts)
    await measureHandshakes(t, p, opts)
    await Promise.all(dispatchers.map((d) => d.destroy()))
  } finally {
    await tearDown(gw, t, dir)
  }
}

type Targets = Awaited<ReturnType<typeof startTargets>>
type ProxyAccess = Awaited<ReturnType<typeof proxyAccess>>
type Gateway = Awaited<ReturnType<typeof spawnGateway>>

/** Concurrent callers in every load. */
const C = 10

/** The target, plain and HTTPS (a leaf of its own CA, which the gateway is told to trust), answering `ok`. */
async function startTargets(dir: string) {
  const targetCa = await CertificateAuthority.load(join(dir, 'target-ca'))
  const leaf = targetCa.leafFor('127.0.0.1')
  const caFile = join(dir, 'target-ca.pem')
  const { writeFileSync } = await import('node:fs')
  writeFileSync(caFile, targetCa.certPem)
  const handler = (_req: IncomingMessage, res: ServerResponse): void => {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 2 })
    res.end('ok')
  }
  const plain = createServer(handler)
  const tls = createHttpsServer({ cert: leaf.cert, key: leaf.key }, handler)
  plain.keepAliveTimeout = tls.keepAliveTimeout = 60_000
  await new Promise<void>((r) => plain.listen(0, '127.0.0.1', r))
  await new Promise<void>((r) => tls.listen(0, '127.0.0.1', r))
  const plainUrl = `http://127.0.0.1:${(plain.address() as AddressInfo).port}`
  const tlsUrl = `https://127.0.0.1:${(tls.address() as AddressInfo).port}`
  return { targetCa, caFile, plain, tls, plainUrl, tlsUrl }
}

/** An agent's proxy credentials, the gateway's proxy address and the CA its intercepted HTTPS is signed by. */
async function proxyAccess(gw: Gateway, dir: string) {
  const acct = readFileSync(join(dir, 'data', 'account-key'), 'utf8').trim()
  const key = (await call(gw.url, 'POST', '/v1/agents', acct, { agentId: 'bench' })).body.apiKey as string
  const started = gw.stdout.map((l) => JSON.parse(l)).find((j) => j.msg === 'paygate started')
  const proxyUrl = started.proxy as string
  const gwCa = readFileSync(started.caFile as string, 'utf8')
  const token = `Basic ${Buffer.from(`bench:${key}`).toString('base64')}`
  return { proxyUrl, gwCa, token }
}

/** Keep-alive requests, plain and HTTPS, direct vs through Paygate (and mitmproxy where installed); the dispatchers, for the caller to destroy. */
async function measurePassthrough(t: Targets, px: ProxyAccess, dir: string, opts: { count: number; maxMs: number }): Promise<(Agent | Pool | ProxyAgent)[]> {
  const { proxyUrl, token, gwCa } = px
  const get = (url: string, dispatcher: Agent | Pool | ProxyAgent) => async (): Promise<void> => {
    const r = await request(url, { dispatcher })
    await r.body.dump()
  }
  const measure = async (name: string, fn: () => Promise<void>): Promise<{ lat: Latencies; rps: number }> => {
    await timeSequential(300, 5_000, fn)
    const lat = await timeSequential(2000, opts.maxMs, fn)
    const tp = await throughput(C, opts.count, opts.maxMs, fn)
    console.log(`${name.padEnd(34)} ${fmt(tp.perSec, 0).padStart(7)} req/s (n=${tp.n})  p50 ${fmt(lat.p50, 3)} ms  p99 ${fmt(lat.p99, 3)} ms`)
    return { lat, rps: tp.perSec }
  }

  console.log(`\n== proxy passthrough (${C} concurrent callers, keep-alive) ==`)
  const directPlain = new Pool(t.plainUrl, { connections: C })
  const viaPlain = new ProxyAgent({ uri: proxyUrl, token, proxyTunnel: false, connections: C } as never)
  const dp = await measure('plain HTTP direct', get(`${t.plainUrl}/`, directPlain))
  const pp = await measure('plain HTTP through Paygate', get(`${t.plainUrl}/`, viaPlain))
  console.log(`  ratio through/direct: ${fmt(pp.rps / dp.rps)}x req/s; p50 +${fmt(pp.lat.p50 - dp.lat.p50, 3)} ms`)

  const directTls = new Agent({ connect: { ca: t.targetCa.certPem }, connections: C })
  const viaTls = new ProxyAgent({ uri: proxyUrl, token, requestTls: { ca: gwCa }, connections: C } as never)
  const dt = await measure('HTTPS direct', get(`${t.tlsUrl}/`, directTls))
  const pt = await measure('HTTPS through Paygate (intercepted)', get(`${t.tlsUrl}/`, viaTls))
  console.log(`  ratio through/direct: ${fmt(pt.rps / dt.rps)}x req/s; p50 +${fmt(pt.lat.p50 - dt.lat.p50, 3)} ms`)
  const mitm = await startMitmproxy(dir, t.caFile)
  if (mitm) {
    const viaMitm = new ProxyAgent({ uri: mitm.url, requestTls: { ca: mitm.ca }, connections: C } as never)
    try {
      const mt = await measure('HTTPS through mitmproxy (intercepted)', get(`${t.tlsUrl}/`, viaMitm))
      console.log(`  Paygate / mitmproxy: ${fmt(pt.rps / mt.rps)}x req/s`)
    } finally {
      await viaMitm.destroy()
      await mitm.stop()
    }
  }
  return [directPlain, viaPlain, directTls, viaTls]
}

/** New TLS handshakes: direct to the target vs CONNECT + intercepted handshake. */
async function measureHandshakes(t: Targets, px: ProxyAccess, opts: { maxMs: number }): Promise<void> {
  const { proxyUrl, token, gwCa } = px
  const p = new URL(proxyUrl)
  const tp = new URL(t.tlsUrl)
  const directHandshake = (): Promise<void> =>
    new Promise((resolve, reject) => {
      const s = tlsConnect({ host: tp.hostname, port: Number(tp.port), ca: t.targetCa.certPem }, () => {
        s.destroy()
        resolve()
      })
      s.on('error', reject)
    })
  const proxiedHandshake = (): Promise<void> =>
    new Promise((resolve, reject) => {
      const req = httpRequest({ host: p.hostname, port: p.port, method: 'CONNECT', path: `${tp.hostname}:${tp.port}`, headers: { 'proxy-authorization': token } })
      req.on('connect', (_res, socket) => {
        const s = tlsConnect({ socket, ca: gwCa, host: tp.hostname }, () => {
          s.destroy()
          resolve()
        })
        s.on('error', reject)
      })
      req.on('error', reject)
      req.end()
    })
  const hd = await throughput(C, 5000, opts.maxMs / 2, directHandshake)
  const hp = await throughput(C, 5000, opts.maxMs / 2, proxiedHandshake)
  console.log(`TLS handshakes: direct ${fmt(hd.perSec, 0)}/s (n=${hd.n}); CONNECT + intercepted ${fmt(hp.perSec, 0)}/s (n=${hp.n}); ratio ${fmt(hp.perSec / hd.perSec)}x`)
}

/** The gateway stopped (its exit code shown where not 0), the targets closed, the temp dir removed. */
async function tearDown(gw: Gateway, t: Targets, dir: string): Promise<void> {
  const code = await gw.stop('SIGTERM')
  if (code !== 0) console.log(`gateway exit: ${code}`)
  t.plain.closeAllConnections()
  t.tls.closeAllConnections()
  await new Promise<void>((r) => t.plain.close(() => r()))
  await new Promise<void>((r) => t.tls.close(() => r()))
  rmSync(dir, { recursive: true, force: true })
}
