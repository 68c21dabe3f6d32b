import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import { connect as netConnect, isIP, type Socket } from 'node:net'
import { Duplex, Readable } from 'node:stream'
import { TLSSocket } from 'node:tls'
import httpProxy from 'http-proxy'
import type { Registry } from '../agents/registry.js'
import type { PaymentEngine, PayOutcome, PayRequest } from '../engine/engine.js'
import { requestDigest, type Idempotency } from '../engine/idempotency.js'
import { readBody, type Upstream } from '../engine/upstream.js'
import { PaygateError, toPaygateError } from '../errors/index.js'
import { unredacted, type Logger } from '../log/index.js'
import { formatUnits } from '../util/money.js'
import type { CertificateAuthority } from './ca.js'
import { forwardRequestHeaders, forwardResponseHeaders, headerValue } from './headers.js'
import { ProxyIdentity } from './identity.js'

export interface ProxyDeps {
  engine: PaymentEngine
  registry: Registry
  upstream: Upstream
  ca: CertificateAuthority
  idempotency: Idempotency
  log: Logger
  maxBufferBytes: number
  defaultAgent: string | null
  passThrough: readonly string[]
  /** Extra CAs trusted for upstream TLS on WebSocket upgrades (the engine has its own). */
  upstreamCa?: string[]
}

/** A CONNECT tunnel's agent and target, as `scheme://host[:port]` and `host[:port]` (computed once, used per request). */
interface Tunnel {
  agentId: string
  origin: string
  authority: string
}

const AUTH_REALM = 'Basic realm="paygate"'
/** The raw 407 for sockets that left HTTP (CONNECT, upgrades). */
const RAW_407 = `HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: ${AUTH_REALM}\r\nContent-Length: 0\r\n\r\n`
const MAX_IDEMPOTENT_BODY = 8 * 1024 * 1024

/** The tunnel's first bytes (null if it ends first), leaving the socket paused. */
function firstChunk(socket: Socket): Promise<Buffer | null> {
  return new Promise((resolve) => {
    const onData = (d: Buffer): void => {
      socket.pause()
      socket.off('end', onEnd)
      resolve(d)
    }
    const onEnd = (): void => {
      socket.off('data', onData)
      resolve(null)
    }
    socket.once('data', onData)
    socket.once('end', onEnd)
  })
}

/**
 * The tunnel as a JS stream that starts with the bytes already read, for the HTTP parser,
 * which takes a net.Socket's native handle directly and would skip data put back with
 * unshift(). (TLSSocket does read what was put back, so intercepted TLS runs on the handle.)
 */
function replayable(socket: Socket, first: Buffer): Duplex {
  const d = new Duplex({
    read() {
      socket.resume()
    },
    write(chunk: Buffer, _enc, cb) {
      socket.write(chunk, cb)
    },
    final(cb) {
      socket.end(cb)
    },
    destroy(err, cb) {
      socket.destroy(err ?? undefined)
      cb(err)
    },
  })
  d.push(first)
  socket.on('data', (c: Buffer) => {
    if (!d.push(c)) socket.pause()
  })
  socket.on('end', () => d.push(null))
  socket.on('close', () => d.destroy())
  socket.on('error', (e) => d.destroy(e))
  return d
}

/**
 * Stream an upstream body to the agent with backpressure. Plain pipe() rather than
 * stream.pipeline(): pipeline builds and aborts an AbortController (a DOMException with a
 * stack) per call, measurable on the passthrough hot path.
 */
function relay(body: Readable, res: ServerResponse): Promise<void> {
  return new Promise((resolve, reject) => {
    const fail = (e: Error): void => {
      body.destroy()
      res.destroy()
      reject(e)
    }
    body.once('error', fail)
    res.once('close', () => {
      if (!res.writableFinished) body.destroy()
      resolve()
    })
    res.once('finish', () => resolve())
    body.pipe(res)
  })
}

/** `host:port` of a CONNECT target, IPv6 in brackets. */
function splitAuthority(authority: string): { host: string; port: number } | null {
  const m = /^\[([^\]]+)\]:(\d{1,5})$/.exec(authority) ?? /^([^:]+):(\d{1,5})$/.exec(authority)
  if (!m) return null
  const port = Number(m[2])
  return port > 0 && port < 65536 ? { host: m[1]!.toLowerCase(), port } : null
}

const urlHost = (host: string): string => (isIP(host) === 6 ? `[${host}]` : host)

function tunnelTo(agentId: string, scheme: 'http' | 'https', host: string, port: number): Tunnel {
  const authority = `${urlHost(host)}${port === (scheme === 'https' ? 443 : 80) ? '' : `:${port}`}`
  return { agentId, origin: `${scheme}://${authority}`, authority }
}

function hostMatches(list: readonly string[], host: string): boolean {
  return list.some((e) => e === host || (e.startsWith('*.') && host.endsWith(e.slice(1))))
}

/**
 * The forward proxy: absolute-form HTTP requests and CONNECT tunnels (TLS intercepted with
 * a leaf certificate from Paygate's CA, or plain HTTP, told apart by the first byte). Every
 * request goes through the payment engine; a 402 is paid under the agent's policy.
 */
export class ProxyServer {
  readonly server: Server
  private readonly inner: Server
  private readonly tunnels = new WeakMap<object, Tunnel>()
  private readonly ws = httpProxy.createProxyServer({ ws: true, xfwd: false })
  /** The line per request: its fields are fixed and secret-free, so it skips redaction. */
  private readonly access: Logger
  private readonly identity: ProxyIdentity
  readonly counters = { requests: 0, paid: 0, rejected: 0, errors: 0, connects: 0, authFailures: 0 }

  constructor(private readonly d: ProxyDeps) {
    this.access = unredacted(d.log)
    this.identity = new ProxyIdentity(d.registry, d.defaultAgent)
    this.server = createServer({ keepAliveTimeout: 65_000 })
    this.inner = createServer({ keepAliveTimeout: 65_000 })
    this.server.on('request', (req, res) => void this.onRequest(req, res))
    this.server.on('connect', (req, socket: Socket, head: Buffer) => void this.onConnect(req, socket, head))
    this.server.on('upgrade', (req, socket: Socket, head: Buffer) => void this.onUpgrade(req, socket, head, null))
    this.inner.on('request', (req, res) => void this.onTunnelRequest(req, res))
    this.inner.on('upgrade', (req, socket: Socket, head: Buffer) => void this.onUpgrade(req, socket, head, this.tunnels.get(req.socket) ?? null))
    this.ws.on('error', (err, _req, target) => {
      this.d.log.warn({ err: err.message }, 'websocket proxy error')
      if (target && 'destroy' in target) (target as Socket).destroy()
    })
  }

  // ---- absolute-form requests -------------------------------------------------------

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let url: URL
    try {
      url = new URL(req.url ?? '')
      if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error('scheme')
    } catch {
      this.fail(res, new PaygateError('invalid_request', 'this is a forward proxy: send absolute-form requests (http://host/path) or CONNECT', { field: 'request-target' }))
      return
    }
    const agentId = await this.identity.of(req.headers)
    if (!agentId) return this.deny(res)
    await this.handle(req, res, agentId, url.href, url.host)
  }

  private async onTunnelRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const t = this.tunnels.get(req.socket)
    if (!t) {
      res.writeHead(500).end()
      return
    }
    await this.handle(req, res, t.agentId, t.origin + (req.url ?? '/'), t.authority)
  }

  private deny(res: ServerResponse): void {
    this.counters.authFailures++
    const body = JSON.stringify({ error: 'unauthorized', detail: 'proxy credentials missing or wrong: use http://<agentId>:<agentKey>@proxy' })
    res.writeHead(407, { 'proxy-authenticate': AUTH_REALM, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) })
    res.end(body)
  }

  private fail(res: ServerResponse, e: PaygateError): void {
    if (res.headersSent) {
      res.destroy()
      return
    }
    const body = JSON.stringify(e.toBody())
    res.writeHead(e.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'x-paygate-error': e.code, ...e.headers })
    res.end(body)
  }

  /** Buffer the request body up to the limit; past it, return a stream of all of it. */
  private async requestBody(req: IncomingMessage): Promise<{ body: Buffer | Readable | null; buffered: boolean }> {
    const declared = req.headers['content-length'] !== undefined ? Number(req.headers['content-length']) : null
    const chunked = req.headers['transfer-encoding'] !== undefined
    if (!chunked && (declared === null || declared === 0)) return { body: null, buffered: true }
    if (declared !== null && declared > this.d.maxBufferBytes) return { body: req, buffered: false }
    const chunks: Buffer[] = []
    let size = 0
    const it = (req as AsyncIterable<Buffer>)[Symbol.asyncIterator]()
    for (;;) {
      const { value, done } = await it.next()
      if (done) return { body: Buffer.concat(chunks), buffered: true }
      chunks.push(value)
      size += value.length
      if (size > this.d.maxBufferBytes) {
        const rest = async function* () {
          yield* chunks
          for (;;) {
            const n = await it.next()
            if (n.done) return
            yield n.value
          }
        }
        return { body: Readable.from(rest()), buffered: false }
      }
    }
  }

  private async handle(req: IncomingMessage, res: ServerResponse, agentId: string, url: string, host: string): Promise<void> {
    const started = performance.now()
    this.counters.requests++
    let status = 0
    let paid: bigint | null = null
    let errorCode: string | undefined
    try {
      const headers = forwardRequestHeaders(req.headers)
      const { body, buffered } = await this.requestBody(req)
      const method = req.method ?? 'GET'
      if (!buffered) {
        // Too large to resend: stream it once; a 402 goes back unpaid, saying why.
        const r = await this.d.upstream.send({ url, method, headers, body })
        const h = forwardResponseHeaders(r.headers)
        if (r.status === 402) h['x-paygate-error'] = errorCode = 'request_body_too_large'
        status = r.status
        res.writeHead(r.status, h)
        await relay(r.body, res)
        return
      }
      const parentTxHash = headerValue(req.headers, 'x-paygate-parent-tx')
      const payReq = { agentId, url, method, headers, body: body as Buffer | null, ...(parentTxHash ? { parentTxHash } : {}) }
      const key = headerValue(req.headers, 'x-paygate-idempotency-key')
      const out = key ? await this.idempotent(agentId, key, payReq) : await this.d.engine.pay(payReq)
      const h = forwardResponseHeaders(out.response.headers)
      if (out.payment) {
        h['x-paygate-tx'] = out.payment.txHash
        h['x-paygate-amount'] = formatUnits(out.payment.amount)
        h['x-paygate-protocol'] = out.payment.protocol
        paid = out.payment.amount
        this.counters.paid++
      }
      if (out.session) h['x-paygate-session'] = 'reused'
      if (out.unpaid) h['x-paygate-error'] = errorCode = out.unpaid.code
      status = out.response.status
      res.writeHead(status, h)
      await relay(out.response.body, res)
    } catch (e) {
      const err = toPaygateError(e)
      if (err.code === 'internal_error') this.d.log.error({ err: e, agentId }, 'proxy request failed')
      if (err.code === 'policy_violation') this.counters.rejected++
      else this.counters.errors++
      errorCode = err.code
      status = err.status
      this.fail(res, err)
    } finally {
      this.access.info(
        {
          agentId,
          method: req.method,
          host,
          status,
          paidUsdc: paid === null ? undefined : formatUnits(paid),
          error: errorCode,
          ms: Math.round((performance.now() - started) * 100) / 100,
        },
        'proxy request',
      )
    }
  }

  /** With X-Paygate-Idempotency-Key: the answer is kept (bounded) and replayed; never a second payment. */
  private async idempotent(agentId: string, key: string, p: PayRequest): Promise<PayOutcome> {
    type Stored = {
      status: number
      headers: Record<string, string | string[] | undefined>
      body: string
      payment: { txHash: string; amount: string; protocol?: 'x402' | 'mpp'; rail?: string } | null
      session?: boolean
    }
    const toOutcome = (s: Stored): PayOutcome => ({
      response: { status: s.status, headers: s.headers, body: Readable.from([Buffer.from(s.body, 'base64')]) },
      payment: s.payment
        ? { protocol: s.payment.protocol ?? 'x402', rail: s.payment.rail ?? 'stablecoin', amount: BigInt(s.payment.amount), txHash: s.payment.txHash, transactionId: '', settlement: null }
        : null,
      ...(s.session ? { session: { protocol: 'mpp' as const } } : {}),
    })
    const stored = await this.d.idempotency.run<Stored & { unpaid?: string }>(agentId, key, requestDigest(p), async () => {
      const out = await this.d.engine.pay(p)
      const body = await readBody(out.response.body, MAX_IDEMPOTENT_BODY)
      return {
        status: out.response.status,
        headers: out.response.headers,
        body: body.toString('base64'),
        payment: out.payment ? { txHash: out.payment.txHash, amount: out.payment.amount.toString(), protocol: out.payment.protocol, rail: out.payment.rail } : null,
        ...(out.session ? { session: true } : {}),
        ...(out.unpaid ? { unpaid: out.unpaid.code } : {}),
      }
    })
    const out = toOutcome(stored)
    return stored.unpaid ? { ...out, unpaid: new PaygateError(stored.unpaid as never, 'unpaid 402') } : out
  }

  // ---- CONNECT --------------------------------------------------------------------------

  private async onConnect(req: IncomingMessage, socket: Socket, head: Buffer): Promise<void> {
    socket.on('error', () => socket.destroy())
    this.counters.connects++
    const target = splitAuthority(req.url ?? '')
    if (!target) {
      socket.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n')
      return
    }
    const agentId = await this.identity.of(req.headers)
    if (!agentId) {
      this.counters.authFailures++
      socket.end(RAW_407)
      return
    }
    if (hostMatches(this.d.passThrough, target.host)) {
      const up = netConnect(target.port, target.host, () => {
        socket.write('HTTP/1.1 200 Connection Established\r\n\r\n')
        if (head.length) up.write(head)
        socket.pipe(up).pipe(socket)
      })
      up.on('error', () => socket.end('HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n'))
      return
    }
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n')
    const first = head.length ? head : await firstChunk(socket)
    if (!first) return
    if (first[0] === 0x16) {
      // A TLS ClientHello: intercept with a leaf for the SNI name (or the CONNECT host, for IPs).
      let secureContext
      try {
        secureContext = this.d.ca.secureContextFor(target.host)
      } catch {
        socket.destroy()
        return
      }
      // TLSSocket hands what the socket holds to the TLS engine, then reads the native handle:
      // no JS stream in between (a Duplex here cost ~15% of intercepted keep-alive throughput).
      socket.unshift(first)
      const tls = new TLSSocket(socket, { isServer: true, secureContext, SNICallback: this.d.ca.sniCallback, ALPNProtocols: ['http/1.1'] })
      tls.on('error', () => tls.destroy())
      this.tunnels.set(tls, tunnelTo(agentId, 'https', target.host, target.port))
      this.inner.emit('connection', tls)
    } else {
      const stream = replayable(socket, first)
      this.tunnels.set(stream, tunnelTo(agentId, 'http', target.host, target.port))
      this.inner.emit('connection', stream)
    }
  }

  // ---- WebSocket upgrades ---------------------------------------------------------------

  private async onUpgrade(req: IncomingMessage, socket: Socket, head: Buffer, tunnel: Tunnel | null): Promise<void> {
    socket.on('error', () => socket.destroy())
    let origin: string
    if (tunnel) origin = tunnel.origin
    else {
      const agentId = await this.identity.of(req.headers)
      if (!agentId) {
        socket.end(RAW_407)
        return
      }
      try {
        const u = new URL(req.url ?? '')
        origin = `${u.protocol === 'wss:' || u.protocol === 'https:' ? 'https' : 'http'}://${u.host}`
        req.url = `${u.pathname}${u.search}`
      } catch {
        socket.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n')
        return
      }
    }
    delete req.headers['proxy-authorization']
    for (const k of Object.keys(req.headers)) if (k.startsWith('x-paygate-')) delete req.headers[k]
    this.ws.ws(req, socket, head, { target: origin, changeOrigin: true, secure: true, ...(this.d.upstreamCa ? { ca: this.d.upstreamCa } : {}) } as never)
  }

  async close(graceMs: number): Promise<void> {
    if (!this.server.listening) return
    const closed = new Promise<void>((r) => this.server.close(() => r()))
    this.server.closeIdleConnections()
    this.inner.closeIdleConnections()
    const timer = setTimeout(() => {
      this.server.closeAllConnections()
      this.inner.closeAllConnections()
    }, graceMs)
    await closed
    clearTimeout(timer)
    this.ws.close()
  }
}
