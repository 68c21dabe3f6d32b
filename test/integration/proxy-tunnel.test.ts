import t from 'tap'
import { writeFileSync } from 'node:fs'
import { createServer, type IncomingMessage, type Server } from 'node:http'
import { createServer as createHttpsServer } from 'node:https'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { join } from 'node:path'
import { connect as tlsConnect } from 'node:tls'
import { Idempotency } from '../../src/engine/idempotency.js'
import { Upstream } from '../../src/upstream/upstream.js'
import { createLogger } from '../../src/log/index.js'
import { CertificateAuthority } from '../../src/proxy/ca.js'
import { BodyFramer, headEnd, parseResponseHead, responseFraming } from '../../src/upstream/http1.js'
import { ProxyServer } from '../../src/proxy/server.js'
import { systemClock } from '../../src/util/clock.js'
import { startTestGateway, tempDir } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'

/**
 * Requests inside CONNECT tunnels, with raw clients: absolute-form targets (RFC 9112
 * §3.2.2), a key revoked while its tunnel is open, and idle tunnels being closed.
 */
const dir = tempDir()
// The HTTPS target's CA, trusted by the gateway for upstream TLS.
const upstreamCa = await CertificateAuthority.load(join(dir, 'upstream-ca'))
const upstreamCaFile = join(dir, 'upstream-ca.pem')
writeFileSync(upstreamCaFile, upstreamCa.certPem)
const gw = await startTestGateway({ env: { PAYGATE_UPSTREAM_CA_FILE: upstreamCaFile } })
t.teardown(() => gw.close())
const proxy = new URL(gw.gw.proxyUrl)

const listen = (s: Server): Promise<number> => listenForTest(t, s)

/** What the targets saw: method and path per request. */
const seen: string[] = []
const echo = (tls: boolean) => (req: IncomingMessage, res: import('node:http').ServerResponse) => {
  let body = ''
  req.on('data', (c: Buffer) => (body += c.toString()))
  req.on('end', () => {
    seen.push(`${req.method} ${req.url}`)
    const text = JSON.stringify({ tls, method: req.method, url: req.url, host: req.headers.host, body })
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) })
    res.end(text)
  })
}
const plainPort = await listen(createServer(echo(false)))
const leaf = upstreamCa.leafFor('127.0.0.1')
const tlsPort = await listen(createHttpsServer({ cert: leaf.cert, key: leaf.key }, echo(true)))

/** One HTTP/1.1 client connection read answer by answer. */
class Raw {
  private buf = Buffer.alloc(0)
  closed = false
  private wake: (() => void) | null = null

  constructor(readonly s: Socket) {
    s.on('data', (d: Buffer) => {
      this.buf = Buffer.concat([this.buf, d])
      this.wake?.()
    })
    s.on('close', () => {
      this.closed = true
      this.wake?.()
    })
    s.on('error', () => {})
  }

  private more(): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no complete answer; have ${JSON.stringify(this.buf.toString('latin1'))}`)), 10_000)
      this.wake = () => {
        clearTimeout(timer)
        this.wake = null
        resolve()
      }
    })
  }

  /** The next answer; `bodiless` for a CONNECT's. */
  async answer(method = 'GET', bodiless = false): Promise<{ status: number; head: string; headers: Record<string, string | string[]>; body: string }> {
    let end: number
    while ((end = headEnd(this.buf)) < 0) {
      if (this.closed) throw new Error(`closed before an answer; have ${JSON.stringify(this.buf.toString('latin1'))}`)
      await this.more()
    }
    const head = parseResponseHead(this.buf, end)!
    const headText = this.buf.toString('latin1', 0, end)
    this.buf = this.buf.subarray(end)
    if (bodiless) return { status: head.status, head: headText, headers: head.map, body: '' }
    const framing = responseFraming(head, method)!
    const framer = new BodyFramer(framing, framing.kind === 'chunked')
    const plain: Buffer[] = []
    for (;;) {
      const stop = framer.feed(this.buf)
      if (stop >= 0) {
        if (!framer.decoding) plain.push(this.buf.subarray(0, stop))
        this.buf = this.buf.subarray(stop)
        break
      }
      if (!framer.decoding) plain.push(this.buf)
      this.buf = Buffer.alloc(0)
      if (this.closed) break
      await this.more()
    }
    const body = Buffer.concat(framer.decoding ? framer.decoded : plain).toString()
    return { status: head.status, head: headText, headers: head.map, body }
  }

  send(text: string): void {
    this.s.write(text)
  }

  /** Resolves once the connection is closed (true), or false after `ms`. */
  closedWithin(ms: number): Promise<boolean> {
    if (this.closed) return Promise.resolve(true)
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), ms)
      this.s.once('close', () => {
        clearTimeout(timer)
        resolve(true)
      })
    })
  }
}

const basicOf = (agentId: string, key: string): string => `Basic ${Buffer.from(`${agentId}:${key}`).toString('base64')}`

/** CONNECT to `127.0.0.1:port` through `proxyPort`; with `tls`, TLS inside, trusting the gateway's CA. */
async function tunnel(port: number, auth: string, opts: { tls?: boolean; proxyPort?: number } = {}): Promise<Raw> {
  const s = connect(opts.proxyPort ?? Number(proxy.port), '127.0.0.1')
  t.teardown(() => s.destroy())
  const raw = new Raw(s)
  raw.send(`CONNECT 127.0.0.1:${port} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nProxy-Authorization: ${auth}\r\n\r\n`)
  const ok = await raw.answer('CONNECT', true)
  if (ok.status !== 200) throw new Error(`CONNECT answered ${ok.status}`)
  if (!opts.tls) return raw
  s.removeAllListeners('data')
  const tls = tlsConnect({ socket: s, ca: gw.gw.ca.certPem, host: '127.0.0.1' })
  await new Promise<void>((resolve, reject) => {
    tls.once('secureConnect', () => resolve())
    tls.once('error', reject)
  })
  t.teardown(() => tls.destroy())
  return new Raw(tls)
}

const agent = async (agentId: string): Promise<{ auth: string; keyId: string }> => {
  const r = (await gw.api('POST', '/v1/agents', { body: { agentId } })).body
  return { auth: basicOf(agentId, r.apiKey), keyId: r.keyId }
}

t.test('absolute-form requests inside a tunnel: its own host and port served, others 400', async (t) => {
  const { auth } = await agent('tun-abs')
  const host = `127.0.0.1:${plainPort}`
  const raw = await tunnel(plainPort, auth)
  raw.send(`GET http://${host}/echo?x=1 HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
  let a = await raw.answer()
  t.equal(a.status, 200, a.body)
  t.match(JSON.parse(a.body), { url: '/echo?x=1', host, tls: false }, 'the target got origin-form, Host from the tunnel')

  // Another host or port than the tunnel's, and asterisk-form: 400 invalid_request; the tunnel goes on.
  for (const target of [`http://127.0.0.2:${plainPort}/x`, `http://127.0.0.1:${plainPort + 1}/x`, `http://example.com/x`, '*', 'ftp://127.0.0.1/x']) {
    seen.length = 0
    raw.send(`GET ${target} HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
    a = await raw.answer()
    t.equal(a.status, 400, target)
    t.match(JSON.parse(a.body), { error: 'invalid_request', field: 'request-target' }, target)
    t.equal(a.headers['x-paygate-error'], 'invalid_request')
    t.same(seen, [], `${target}: nothing sent to any target`)
  }
  raw.send(`POST /after HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 2\r\n\r\nhi`)
  a = await raw.answer()
  t.match(JSON.parse(a.body), { method: 'POST', url: '/after', body: 'hi' }, 'origin-form still served on the same tunnel')

  // Inside intercepted TLS too, and the default port spelled out or not.
  const tlsHost = `127.0.0.1:${tlsPort}`
  const sec = await tunnel(tlsPort, auth, { tls: true })
  sec.send(`GET https://${tlsHost}/secure HTTP/1.1\r\nHost: ${tlsHost}\r\n\r\n`)
  a = await sec.answer()
  t.equal(a.status, 200, a.body)
  t.match(JSON.parse(a.body), { url: '/secure', tls: true })
  sec.send(`DELETE https://${tlsHost}/gone?y=2 HTTP/1.1\r\nHost: ${tlsHost}\r\n\r\n`)
  a = await sec.answer()
  t.match(JSON.parse(a.body), { method: 'DELETE', url: '/gone?y=2', tls: true })
  t.notOk(
    gw.logs.some((l) => l.includes('Invalid URL')),
    'no internal error logged',
  )
})

t.test('a key revoked while its tunnel is open: the next request inside gets 407 and the tunnel closes', async (t) => {
  const keep = await agent('tun-keep')
  const fast = await agent('tun-fast')
  const node = await agent('tun-node')
  const sec = await agent('tun-tls')
  const host = `127.0.0.1:${plainPort}`
  const tunnels = {
    keep: await tunnel(plainPort, keep.auth),
    fast: await tunnel(plainPort, fast.auth),
    node: await tunnel(plainPort, node.auth),
    sec: await tunnel(tlsPort, sec.auth, { tls: true }),
  }
  for (const [name, raw] of Object.entries(tunnels)) {
    raw.send(`GET /${name}-1 HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
    t.equal((await raw.answer()).status, 200, `${name}: served before the revocation`)
  }
  for (const a of [fast, node, sec]) t.equal((await gw.api('DELETE', `/v1/keys/${a.keyId}`)).status, 200)
  seen.length = 0

  // A tunnel whose key still holds goes on after someone else's revocation.
  tunnels.keep.send(`GET /keep-2 HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
  t.equal((await tunnels.keep.answer()).status, 200, 'an unrevoked key keeps its tunnel')

  // The fast path (bodiless GET), Node's parser (a body), and intercepted TLS.
  tunnels.fast.send(`GET /fast-2 HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
  tunnels.node.send(`POST /node-2 HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 5\r\n\r\nhello`)
  tunnels.sec.send(`GET /sec-2 HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
  for (const [name, raw] of Object.entries(tunnels)) {
    if (name === 'keep') continue
    const a = await raw.answer(name === 'node' ? 'POST' : 'GET')
    t.equal(a.status, 407, `${name}: 407`)
    t.equal(a.headers['proxy-authenticate'], 'Basic realm="paygate"', name)
    t.match(JSON.parse(a.body), { error: 'unauthorized' }, name)
    t.ok(await raw.closedWithin(5_000), `${name}: the tunnel is closed`)
  }
  t.same(seen, ['GET /keep-2'], 'no request on a revoked key reached the target')
  // A new CONNECT with a revoked key: the same 407.
  await t.rejects(tunnel(plainPort, fast.auth), /CONNECT answered 407/)
})

t.test('idle tunnels are closed: before their first byte and between requests, as plain connections', async (t) => {
  // A proxy on the same gateway parts with a short idle limit (the gateway's is 65 s).
  const IDLE = 1_000
  const upstream = new Upstream(upstreamCaFile, gw.gw.egress)
  const idle = new ProxyServer({
    engine: gw.gw.engine,
    registry: gw.gw.registry,
    upstream,
    ca: gw.gw.ca,
    idempotency: new Idempotency(gw.gw.store, systemClock, 60_000),
    log: createLogger('silent'),
    maxBufferBytes: 1024 * 1024,
    defaultAgent: null,
    passThrough: ['localhost'],
    idleTimeoutMs: IDLE,
  })
  await new Promise<void>((r) => idle.server.listen(0, '127.0.0.1', r))
  t.teardown(async () => {
    await idle.close(100)
    await upstream.close()
  })
  const proxyPort = (idle.server.address() as AddressInfo).port
  const { auth } = await agent('tun-idle')
  const host = `127.0.0.1:${plainPort}`

  const timed = async (raw: Raw): Promise<number> => {
    const started = Date.now()
    t.ok(await raw.closedWithin(IDLE * 5), 'closed')
    return Date.now() - started
  }
  // CONNECT, then silence.
  let ms = await timed(await tunnel(plainPort, auth, { proxyPort }))
  t.ok(ms >= IDLE * 0.8, `a silent tunnel closed after ${ms} ms (not at once)`)
  // One request in a plain-HTTP tunnel, one in an intercepted one, then idle.
  for (const tls of [false, true]) {
    const raw = await tunnel(tls ? tlsPort : plainPort, auth, { proxyPort, tls })
    raw.send(`GET /idle HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
    t.equal((await raw.answer()).status, 200)
    ms = await timed(raw)
    t.ok(ms >= IDLE * 0.8, `${tls ? 'TLS' : 'plain'} tunnel idle after a request: closed after ${ms} ms`)
  }
  // A pass-through tunnel (no interception): the same limit.
  const pt = connect(proxyPort, '127.0.0.1')
  t.teardown(() => pt.destroy())
  const passed = new Raw(pt)
  passed.send(`CONNECT localhost:${plainPort} HTTP/1.1\r\nHost: localhost:${plainPort}\r\nProxy-Authorization: ${auth}\r\n\r\n`)
  t.equal((await passed.answer('CONNECT', true)).status, 200, 'a pass-through tunnel opens')
  ms = await timed(passed)
  t.ok(ms >= IDLE * 0.8, `a silent pass-through tunnel closed after ${ms} ms`)
  // A plain connection to the proxy port: the same limit.
  const s = connect(proxyPort, '127.0.0.1')
  t.teardown(() => s.destroy())
  const plain = new Raw(s)
  plain.send(`GET http://${host}/plain HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: ${auth}\r\n\r\n`)
  t.equal((await plain.answer()).status, 200)
  ms = await timed(plain)
  t.ok(ms >= IDLE * 0.8, `plain connection: closed after ${ms} ms`)
})

t.test('proxy.idleTimeoutMs reaches the proxy', async (t) => {
  t.equal(gw.gw.proxy.idleTimeoutMs, 65_000, 'the default')
  const short = await startTestGateway({ env: { PAYGATE_PROXY_IDLE_TIMEOUT_MS: '1500' } })
  t.teardown(() => short.close())
  t.equal(short.gw.proxy.idleTimeoutMs, 1500, 'as configured')
})
