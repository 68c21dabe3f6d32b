import { createServer, STATUS_CODES, type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeaders, type Server as HttpServer, type ServerResponse } from 'node:http'
import { connect as netConnect, createServer as createNetServer, isIP, type Server, type Socket } from 'node:net'
import { Duplex, Readable } from 'node:stream'
import { TLSSocket } from 'node:tls'
import httpProxy from 'http-proxy'
import type { Registry } from '../agents/registry.js'
import type { FirstAnswer, PaymentEngine, PayOutcome, PayRequest, PayStart } from '../engine/engine.js'
import { requestDigest, type Idempotency } from '../engine/idempotency.js'
import { unreachable } from '../upstream/errors.js'
import type { Upstream } from '../upstream/upstream.js'
import { PaygateError, RequestTimeoutError, toPaygateError } from '../errors/index.js'
import { parserRefusal } from '../errors/http-parser.js'
import { isEgressDenied, type EgressGuard } from '../net/egress.js'
import { infoLine, type Logger } from '../log/index.js'
import { collectUpTo, headThen } from '../util/collect.js'
import { endLingering } from '../util/linger.js'
import { formatUnits } from '../util/money.js'
import type { CertificateAuthority } from './ca.js'
import { FastConn, type FastHost, type Tunnel } from './fast.js'
import { forwardRequestHeaders, forwardResponseHeaders, headerValue } from './headers.js'
import { hasConnectionToken, httpTarget, type RequestHead } from '../upstream/http1.js'
import { ProxyIdentity } from './identity.js'
import { OriginPool, type Origin } from '../upstream/origins.js'
import { requestHead, sendFirst, writeAnswer } from './relay.js'

export interface ProxyDeps {
  engine: PaymentEngine
  registry: Registry
  upstream: Upstream
  ca: CertificateAuthority
  idempotency: Idempotency
  log: Logger
  maxBufferBytes: number
  /** Deadline for a body being buffered (`proxy.bufferTimeoutMs`); default 30 s. */
  bufferTimeoutMs?: number
  defaultAgent: string | null
  passThrough: readonly string[]
  /** The info line per proxied request (default on). */
  accessLog?: boolean
  /** Extra CAs trusted for upstream TLS on WebSocket upgrades (the engine has its own). */
  upstreamCa?: string[]
  /** Keep-alive idle limit on agent connections, and the time a CONNECT tunnel may stay silent before its first byte (default 65 s, as Node's server). */
  idleTimeoutMs?: number
}

const AUTH_REALM = 'Basic realm="paygate"'
const MAX_IDEMPOTENT_BODY = 8 * 1024 * 1024
/** Safe (RFC 9110 §9.2.1), so sending one again is harmless, and without a body: the methods the fast path serves. */
const FAST_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])

/**
 * The tunnel's first bytes, leaving the socket paused; null if it ends, closes or stays
 * silent for `timeoutMs` first (the fast path's idle limit takes over from the first byte).
 */
function firstChunk(socket: Socket, timeoutMs: number): Promise<Buffer | null> {
  return new Promise((resolve) => {
    const settle = (d: Buffer | null): void => {
      socket.off('data', onData)
      socket.off('end', onEnd)
      socket.off('close', onEnd)
      socket.off('timeout', onEnd)
      socket.setTimeout(0)
      resolve(d)
    }
    const onData = (d: Buffer): void => {
      socket.pause()
      settle(d)
    }
    const onEnd = (): void => settle(null)
    socket.on('data', onData)
    socket.on('end', onEnd)
    socket.on('close', onEnd)
    socket.on('timeout', onEnd)
    socket.setTimeout(timeoutMs)
    socket.resume()
  })
}

/** `p`, or a 408 `invalid_request` once `ms` have passed first. */
function byDeadline<T>(p: Promise<T>, ms: number, detail: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new RequestTimeoutError(detail)), ms)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}

/**
 * The rest of a request body, after the `head` already read, as a stream of its own for a
 * single upstream send. Destroying it (the target failed) leaves the agent's connection
 * alone: the rest of the body is read and dropped, so the answer still reaches the agent
 * (a socket closed with unread bytes is reset, and the answer with it).
 */
function onward(req: IncomingMessage, head: Buffer): Readable {
  const onData = (c: Buffer): void => {
    if (!out.push(c)) req.pause()
  }
  const onEnd = (): void => {
    out.push(null)
  }
  const onError = (e: Error): void => {
    out.destroy(e)
  }
  const out = new Readable({
    read() {
      req.resume()
    },
    destroy(err, cb) {
      req.off('data', onData)
      req.off('end', onEnd)
      req.off('error', onError)
      req.resume()
      cb(err)
    },
  })
  if (head.length) out.push(head)
  req.on('data', onData)
  req.on('end', onEnd)
  req.on('error', onError)
  return out
}

/**
 * Thrown out of an idempotent run whose answer cannot be kept and cost nothing: no result is
 * stored (not a PaygateError); the key's marker stays, and the next call with the key finds
 * no payment behind it and asks the target again.
 */
class NotKept extends Error {}

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
  // Node's HTTP server arms its keep-alive and request timeouts through these.
  ;(d as Duplex & { setTimeout(ms: number, cb?: () => void): Duplex }).setTimeout = (ms, cb) => {
    socket.setTimeout(ms)
    if (cb) d.once('timeout', cb)
    return d
  }
  socket.on('timeout', () => d.emit('timeout'))
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

/** The error JSON as an answer, with `X-Paygate-Error` naming the code. */
function errorAnswer(e: PaygateError): { headers: OutgoingHttpHeaders; body: Buffer } {
  const body = Buffer.from(JSON.stringify(e.toBody()))
  return { headers: { 'content-type': 'application/json', 'content-length': body.length, 'x-paygate-error': e.code, ...e.headers }, body }
}

/**
 * An answer Paygate composes on a socket that left HTTP (CONNECT, upgrades), closing it:
 * the same error JSON and `X-Paygate-Error` as every other answer Paygate makes, so an
 * agent never mistakes it for a target's.
 */
function rawAnswer(e: PaygateError, status = e.status): string {
  const { headers, body } = errorAnswer(e)
  let out = `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\n`
  for (const [k, v] of Object.entries(headers)) out += `${k}: ${String(v)}\r\n`
  return `${out}connection: close\r\n\r\n${body.toString()}`
}

/** Missing or wrong proxy credentials: 407 (the error is `unauthorized`, as on the API). */
const DENIED = new PaygateError('unauthorized', 'proxy credentials missing or wrong: use http://<agentId>:<agentKey>@proxy', {}, { 'proxy-authenticate': AUTH_REALM })
const { headers: DENY_HEADERS, body: DENY_BODY } = errorAnswer(DENIED)
const RAW_407 = rawAnswer(DENIED, 407)

/** `host:port` of a CONNECT target, IPv6 in brackets. */
function splitAuthority(authority: string): { host: string; port: number } | null {
  const m = /^\[([^\]]+)\]:(\d{1,5})$/.exec(authority) ?? /^([^:]+):(\d{1,5})$/.exec(authority)
  if (!m) return null
  const port = Number(m[2])
  return port > 0 && port < 65536 ? { host: m[1]!.toLowerCase(), port } : null
}

const urlHost = (host: string): string => (isIP(host) === 6 ? `[${host}]` : host)

function tunnelTo(agentId: string, auth: string | undefined, revision: number, scheme: 'http' | 'https', host: string, port: number): Tunnel {
  const authority = `${urlHost(host)}${port === (scheme === 'https' ? 443 : 80) ? '' : `:${port}`}`
  return { agentId, origin: `${scheme}://${authority}`, authority, dest: { https: scheme === 'https', host, port }, auth, revision }
}

/**
 * The path of a request inside a tunnel: origin-form as it is, absolute-form (which a server
 * MUST accept, RFC 9112 §3.2.2) only for the tunnel's own host and port. Null for anything
 * else (another host, `*`).
 */
function tunnelPath(t: Tunnel, target: string): string | null {
  if (target.startsWith('/')) return target
  let u: URL
  let own: URL
  try {
    u = new URL(target)
    own = new URL(`http://${urlHost(t.dest.host)}`)
  } catch {
    return null
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return null
  const port = u.port ? Number(u.port) : u.protocol === 'https:' ? 443 : 80
  return u.hostname === own.hostname && port === t.dest.port ? u.pathname + u.search : null
}

const tunnelTargetError = (t: Tunnel): PaygateError =>
  new PaygateError('invalid_request', `inside a tunnel to ${t.authority}, send origin-form requests (/path) or absolute-form ones for that host and port`, { field: 'request-target' })

function hostMatches(list: readonly string[], host: string): boolean {
  return list.some((e) => e === host || (e.startsWith('*.') && host.endsWith(e.slice(1))))
}

/**
 * The forward proxy: absolute-form HTTP requests and CONNECT tunnels (TLS intercepted with
 * a leaf certificate from Paygate's CA, or plain HTTP, told apart by the first byte). Every
 * request goes through the payment engine; a 402 is paid under the agent's policy.
 */
export class ProxyServer implements FastHost {
  /** The proxy port: connections start on the fast path (src/proxy/fast.ts). */
  readonly server: Server
  /** Node's HTTP server for connections handed off the fast path (bodies, upgrades, HTTP/1.0, ...). */
  private readonly http: HttpServer
  /** The same for requests inside CONNECT tunnels. */
  private readonly inner: HttpServer
  private readonly fastConns = new Set<FastConn>()
  /** Per connection on Node's servers: responses under way, and a parser refusal to answer once they are done. */
  private readonly inFlight = new WeakMap<Duplex, { responses: number; refused?: () => void }>()
  /** Connections that left the fast path (handed to Node's servers, tunnels, upgrades): cut at shutdown after the grace period. */
  private readonly others = new Set<Socket>()
  private readonly origins: OriginPool
  private closing = false
  private readonly tunnels = new WeakMap<object, Tunnel>()
  private readonly ws = httpProxy.createProxyServer({ ws: true, xfwd: false })
  /** Bytes an upgrading socket had sent before the upgrade (a net.Socket's count; streams handed to Node's servers have none). */
  private readonly upgradeSent = new WeakMap<object, number>()
  /** The line per request: its fields are fixed and secret-free. */
  private readonly access: ReturnType<typeof infoLine>
  private readonly identity: ProxyIdentity
  /** The engine's egress guard (the upstream's): the proxy's own connections ask it too. */
  private readonly egress: EgressGuard
  readonly counters = { requests: 0, paid: 0, rejected: 0, errors: 0, connects: 0, authFailures: 0 }
  readonly idleTimeoutMs: number

  constructor(private readonly d: ProxyDeps) {
    this.access = infoLine(d.log, 'proxy request')
    this.identity = new ProxyIdentity(d.registry, d.defaultAgent)
    this.egress = d.upstream.egress
    this.origins = new OriginPool(d.upstream.secureContext, this.egress, d.upstream.timeoutMs)
    this.idleTimeoutMs = d.idleTimeoutMs ?? 65_000
    // allowHalfOpen: an agent that half-closes after its request still gets the answer.
    this.server = createNetServer({ noDelay: true, allowHalfOpen: true }, (socket) => this.startFast(socket, null))
    this.http = createServer({ keepAliveTimeout: this.idleTimeoutMs })
    this.inner = createServer({ keepAliveTimeout: this.idleTimeoutMs })
    for (const s of [this.http, this.inner]) {
      s.on('request', (req: IncomingMessage, res: ServerResponse) => this.track(req.socket, res))
      s.on('clientError', (e: NodeJS.ErrnoException, socket: Duplex) => this.refuse(e, socket))
    }
    this.http.on('request', (req, res) => this.guard(this.onRequest(req, res), req.socket))
    this.http.on('connect', (req: IncomingMessage, socket: Socket, head: Buffer) => this.guard(this.onConnect(req.url ?? '', req.headers, socket, head), socket))
    this.http.on('upgrade', (req, socket: Socket, head: Buffer) => this.guard(this.onUpgrade(req, socket, head, null), socket))
    this.inner.on('request', (req, res) => this.guard(this.onTunnelRequest(req, res), req.socket))
    this.inner.on('upgrade', (req, socket: Socket, head: Buffer) => this.guard(this.onUpgrade(req, socket, head, this.tunnels.get(req.socket) ?? null), socket))
    this.ws.on('error', (err, _req, target) => {
      this.d.log.warn({ err: err.message }, 'websocket proxy error')
      if (!target || !('destroy' in target)) return
      const socket = target as Socket
      // Nothing sent to the agent since the upgrade began (the target never answered it): say so, as any failed send.
      const before = this.upgradeSent.get(socket)
      const answer = isEgressDenied(err) ? err : new PaygateError('upstream_unreachable', `the target could not be reached: ${err.message}`)
      if (before !== undefined && socket.bytesWritten === before && socket.writable) socket.end(rawAnswer(answer))
      else socket.destroy()
    })
  }

  /**
   * A handler's failure that escaped its own error handling (a store read in the identity
   * check, say) is logged and its connection closed: never an unhandled rejection.
   */
  private guard(p: Promise<void>, socket: Duplex): void {
    p.catch((e: unknown) => {
      this.d.log.error({ err: e }, 'proxy handler failed')
      socket.destroy()
    })
  }

  private track(socket: Duplex, res: ServerResponse): void {
    let flight = this.inFlight.get(socket)
    if (!flight) this.inFlight.set(socket, (flight = { responses: 0 }))
    flight.responses++
    res.once('close', () => {
      if (--flight.responses === 0) flight.refused?.()
    })
  }

  /**
   * A request Node's parser refuses (a head over its 16 KiB limit, a bad header line) gets
   * Paygate's error answer (431, 400, ...) with `X-Paygate-Error`, after the answers under way
   * on that connection, and the connection is closed without a reset.
   */
  private refuse(e: NodeJS.ErrnoException, socket: Duplex): void {
    const flight = this.inFlight.get(socket)
    // The parser reports the error again on every later chunk: answer once.
    if (flight?.refused) return
    const answer = (): void => {
      if (!socket.writable) return void socket.destroy()
      const { status, error } = parserRefusal(e)
      endLingering(socket, rawAnswer(error, status))
    }
    const f = flight ?? { responses: 0 }
    this.inFlight.set(socket, f)
    if (f.responses) f.refused = answer
    else {
      f.refused = () => {}
      answer()
    }
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
    if (!t) return this.fail(res, new PaygateError('internal_error', 'internal error; safe to retry with backoff'))
    if (t.revision !== this.d.registry.revision && !(await this.stillHolds(t))) return this.deny(res, true)
    const path = tunnelPath(t, req.url ?? '/')
    if (path === null) return this.fail(res, tunnelTargetError(t))
    await this.handle(req, res, t.agentId, t.origin + path, t.authority)
  }

  /** `close`: the tunnel's key was revoked, so the tunnel ends with this answer. */
  private deny(res: ServerResponse, close = false): void {
    this.counters.authFailures++
    res.writeHead(407, close ? { ...DENY_HEADERS, connection: 'close' } : DENY_HEADERS)
    res.end(DENY_BODY)
  }

  /**
   * A tunnel is authenticated at CONNECT; after any revocation since (the registry's
   * revision moved) its credential is verified again before the next request inside it.
   */
  private async stillHolds(t: Tunnel): Promise<boolean> {
    const revision = this.d.registry.revision
    const agentId = await this.identity.of(t.auth === undefined ? {} : { 'proxy-authorization': t.auth })
    if (agentId !== t.agentId) return false
    t.revision = revision
    return true
  }

  private fail(res: ServerResponse, e: PaygateError): void {
    if (res.headersSent) {
      res.destroy()
      return
    }
    const { headers, body } = errorAnswer(e)
    res.writeHead(e.status, headers)
    res.end(body)
  }

  /** Buffer the request body up to the limit; past it, return a stream of all of it. */
  private async requestBody(req: IncomingMessage): Promise<{ body: Buffer | Readable | null; buffered: boolean }> {
    const declared = req.headers['content-length'] !== undefined ? Number(req.headers['content-length']) : null
    const chunked = req.headers['transfer-encoding'] !== undefined
    if (!chunked && (declared === null || declared === 0)) return { body: null, buffered: true }
    if (declared !== null && declared > this.d.maxBufferBytes) return { body: onward(req, Buffer.alloc(0)), buffered: false }
    const ms = this.d.bufferTimeoutMs ?? 30_000
    const { head, rest } = await byDeadline(collectUpTo(req, this.d.maxBufferBytes), ms, `the request body was not received within ${ms} ms`)
    return rest ? { body: onward(req, head), buffered: false } : { body: head, buffered: true }
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
        const stream = body as Readable
        try {
          const r = await this.d.upstream.send({ url, method, headers, body: stream }).catch(unreachable)
          const h = forwardResponseHeaders(r.headers)
          if (r.status === 402) h['x-paygate-error'] = errorCode = 'request_body_too_large'
          status = r.status
          res.writeHead(r.status, h)
          await relay(r.body, res)
        } finally {
          // What the target did not read is dropped, so the agent's connection stays in step.
          if (!stream.readableEnded) stream.destroy()
        }
        return
      }
      const parentTxHash = headerValue(req.headers, 'x-paygate-parent-tx')
      const payReq = { agentId, url, method, headers, body: body as Buffer | null, ...(parentTxHash ? { parentTxHash } : {}) }
      const key = headerValue(req.headers, 'x-paygate-idempotency-key')
      const out = key ? await this.idempotent(agentId, key, payReq) : await this.d.engine.pay(payReq)
      const a = this.answerOf(out)
      ;({ status, paid, errorCode } = a)
      res.writeHead(status, a.headers)
      await relay(out.response.body, res)
    } catch (e) {
      const err = this.failure(e, agentId)
      errorCode = err.code
      status = err.status
      this.fail(res, err)
      // A late body: its answer says the connection closes; what still trickles in is dropped meanwhile.
      if (err instanceof RequestTimeoutError) res.once('finish', () => endLingering(req.socket))
    } finally {
      this.logRequest(agentId, req.method ?? 'GET', host, status, paid, errorCode, started)
    }
  }

  /** The agent's view of an engine outcome: the target's answer plus Paygate's headers. */
  private answerOf(out: PayOutcome): { status: number; headers: OutgoingHttpHeaders; paid: bigint | null; errorCode: string | undefined } {
    const h = forwardResponseHeaders(out.response.headers)
    let paid: bigint | null = null
    let errorCode: string | undefined
    if (out.payment) {
      h['x-paygate-tx'] = out.payment.txHash
      h['x-paygate-amount'] = formatUnits(out.payment.amount)
      h['x-paygate-protocol'] = out.payment.protocol
      paid = out.payment.amount
      this.counters.paid++
    }
    if (out.session) h['x-paygate-session'] = 'reused'
    if (out.unpaid) h['x-paygate-error'] = errorCode = out.unpaid.code
    return { status: out.response.status, headers: h, paid, errorCode }
  }

  private failure(e: unknown, agentId: string): PaygateError {
    const err = toPaygateError(e)
    if (err.code === 'internal_error') this.d.log.error({ err: e, agentId }, 'proxy request failed')
    if (err.code === 'policy_violation') this.counters.rejected++
    else this.counters.errors++
    return err
  }

  /** The access line; with `accessLog: false`, only for payments and failures (a paid or failed request is always logged). */
  private logRequest(agentId: string, method: string, host: string, status: number, paid: bigint | null, error: string | undefined, started: number): void {
    if (this.d.accessLog === false && paid === null && error === undefined) return
    this.access({ agentId, method, host, status, paidUsdc: paid === null ? undefined : formatUnits(paid), error, ms: Math.round((performance.now() - started) * 100) / 100 })
  }

  /**
   * With X-Paygate-Idempotency-Key: the answer is kept (bounded) and replayed; never a second
   * payment. An answer too large to keep streams through to this call; if it cost nothing it
   * is not stored (a retry simply asks again), and if it was paid the key keeps the payment
   * with a 502 `upstream_body_too_large` in place of the body, so replays see the txHash and
   * never pay again. A paid answer whose body broke off is kept the same way.
   */
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
    const paymentOf = (out: PayOutcome): Stored['payment'] =>
      out.payment ? { txHash: out.payment.txHash, amount: out.payment.amount.toString(), protocol: out.payment.protocol, rail: out.payment.rail } : null
    /** A paid answer whose body is not kept: the payment, and an error body saying why. */
    const withoutBody = (payment: NonNullable<Stored['payment']>, status: number | null, code: string, detail: string): Stored => {
      const body = Buffer.from(JSON.stringify({ error: code, detail, status, txHash: payment.txHash }))
      return {
        status: 502,
        headers: { 'content-type': 'application/json', 'content-length': String(body.length), 'x-paygate-error': code },
        body: body.toString('base64'),
        payment,
      }
    }
    // This call's own answer, when its body was too large to keep: it streams through.
    const live: { out?: PayOutcome } = {}
    let stored: Stored & { unpaid?: string }
    try {
      // The request is its method, URL and body (and their type): headers an agent's HTTP stack
      // adds per attempt (trace ids, retry counters) do not make a retry another request.
      const contentType = p.headers['content-type']
      const digest = requestDigest({ ...p, headers: contentType === undefined ? {} : { 'content-type': contentType } })
      const recover = async (startedAt: number): Promise<(Stored & { unpaid?: string }) | undefined> => {
        const rec = await this.d.engine.cutOff(agentId, key, startedAt)
        if (!rec) return undefined
        const payment = { txHash: rec.txHash!, amount: rec.amount, protocol: rec.protocol ?? 'x402', rail: rec.rail ?? 'stablecoin' }
        return withoutBody(payment, rec.upstreamStatus ?? null, 'upstream_body_lost', "Paygate restarted before this request's answer was returned; the payment stands")
      }
      stored = await this.d.idempotency.run<Stored & { unpaid?: string }>(
        agentId,
        key,
        digest,
        async () => {
          const out = await this.d.engine.pay({ ...p, idempotencyKey: key })
          let read: { head: Buffer; rest: Readable | null }
          try {
            read = await collectUpTo(out.response.body, MAX_IDEMPOTENT_BODY)
          } catch (e) {
            // Nothing paid: not stored (as any unreachable target), so the same key asks again.
            if (!out.payment) throw new PaygateError('upstream_unreachable', `the target's answer broke off before its end: ${(e as Error).message}`)
            this.d.log.warn({ err: (e as Error).message, agentId, txHash: out.payment.txHash }, 'a paid answer broke off while it was read')
            return withoutBody(
              paymentOf(out)!,
              out.response.status,
              'upstream_body_lost',
              `the target's ${out.response.status} answer to this paid request broke off before its end; the payment stands`,
            )
          }
          if (read.rest) {
            live.out = { ...out, response: { ...out.response, body: headThen(read.head, read.rest) } }
            if (!out.payment) throw new NotKept()
            return withoutBody(
              paymentOf(out)!,
              out.response.status,
              'upstream_body_too_large',
              `the target's ${out.response.status} answer to this paid request was delivered once, to the first call; its body exceeds the ${MAX_IDEMPOTENT_BODY} bytes kept for replays`,
            )
          }
          return {
            status: out.response.status,
            headers: out.response.headers,
            body: read.head.toString('base64'),
            payment: paymentOf(out),
            ...(out.session ? { session: true } : {}),
            ...(out.unpaid ? { unpaid: out.unpaid.code } : {}),
          }
        },
        undefined,
        recover,
      )
    } catch (e) {
      if (e instanceof NotKept && live.out) return live.out
      live.out?.response.body.destroy()
      throw e
    }
    if (live.out) return live.out
    const out = toOutcome(stored)
    return stored.unpaid ? { ...out, unpaid: new PaygateError(stored.unpaid as never, 'unpaid 402') } : out
  }

  // ---- the fast path ----------------------------------------------------------------------

  private startFast(socket: Socket, tunnel: Tunnel | null, initial: Buffer | null = null): void {
    if (this.closing) {
      socket.destroy()
      return
    }
    const conn = new FastConn(socket, this, tunnel, initial)
    this.fastConns.add(conn)
    conn.start()
  }

  forget(conn: FastConn): void {
    this.fastConns.delete(conn)
  }

  private hold(socket: Socket): void {
    if (this.others.has(socket)) return
    this.others.add(socket)
    socket.once('close', () => this.others.delete(socket))
  }

  route(head: RequestHead, conn: FastConn): 'fast' | 'takeover' | 'node' {
    if (head.method === 'CONNECT') return conn.tunnel ? 'node' : 'takeover'
    const m = head.map
    if (m.upgrade !== undefined) {
      const upgrade = head.method === 'GET' && hasConnectionToken(m.connection, 'upgrade') && m['content-length'] === undefined && m['transfer-encoding'] === undefined
      return upgrade ? 'takeover' : 'node'
    }
    if (!FAST_METHODS.has(head.method) || m.host === undefined || m['transfer-encoding'] !== undefined || m.expect !== undefined) return 'node'
    if (m['content-length'] !== undefined && m['content-length'] !== '0') return 'node'
    if (m['x-paygate-idempotency-key'] !== undefined || m['x-paygate-parent-tx'] !== undefined) return 'node'
    return (conn.tunnel ? head.target.startsWith('/') : head.target.startsWith('http://')) ? 'fast' : 'node'
  }

  handoff(conn: FastConn, pending: Buffer): void {
    this.hold(conn.socket)
    const stream = replayable(conn.socket, pending)
    if (conn.tunnel) {
      this.tunnels.set(stream, conn.tunnel)
      this.inner.emit('connection', stream)
    } else this.http.emit('connection', stream)
  }

  takeover(conn: FastConn, head: RequestHead, rest: Buffer): void {
    this.hold(conn.socket)
    const headers = { ...head.map } as IncomingHttpHeaders
    if (head.method === 'CONNECT') {
      this.guard(this.onConnect(head.target, headers, conn.socket, rest), conn.socket)
      return
    }
    // An upgrade: http-proxy reads only these fields of the request.
    const req = { method: head.method, url: head.target, headers, httpVersion: '1.1', httpVersionMajor: 1, httpVersionMinor: 1, rawHeaders: head.raw } as unknown as IncomingMessage
    this.guard(this.onUpgrade(req, conn.socket, rest, conn.tunnel), conn.socket)
  }

  /** One request on the fast path: identity, the engine's lookups, the first send on the proxy's own connection, then relay or pay. */
  async serve(conn: FastConn, head: RequestHead): Promise<void> {
    const started = performance.now()
    let agentId: string
    let url: string
    let host: string
    let dest: Origin
    let path: string
    let origin: string
    if (conn.tunnel) {
      const t = conn.tunnel
      if (t.revision !== this.d.registry.revision && !(await this.stillHolds(t))) {
        // The key was revoked since CONNECT: the 407 a new connection would get, then the tunnel ends.
        this.counters.authFailures++
        conn.closeAfter = true
        return writeAnswer(conn, head.method, 407, DENY_HEADERS, DENY_BODY)
      }
      ;({ agentId, authority: host, dest, origin } = t)
      url = t.origin + head.target
      path = head.target
    } else {
      const headers = head.map as IncomingHttpHeaders
      // Known answers (a refusal too) without an await; only a new credential is verified.
      const known = this.identity.known(headers)
      const id = known !== undefined ? known : await this.identity.of(headers)
      if (!id) {
        this.counters.authFailures++
        return writeAnswer(conn, head.method, 407, DENY_HEADERS, DENY_BODY)
      }
      agentId = id
      const target = httpTarget(head.target)
      if (!target) {
        return this.writeError(
          conn,
          head.method,
          new PaygateError('invalid_request', 'this is a forward proxy: send absolute-form requests (http://host/path) or CONNECT', { field: 'request-target' }),
        )
      }
      url = target.href
      host = target.authority
      path = target.path
      origin = `http://${target.authority}`
      dest = { https: false, host: target.hostname, port: target.port }
    }
    this.counters.requests++
    const method = head.method
    let status = 0
    let paid: bigint | null = null
    let errorCode: string | undefined
    try {
      const payReq: PayRequest = { agentId, url, origin, method, headers: forwardRequestHeaders(head.map as IncomingHttpHeaders, this.d.engine.acceptPayment), body: null }
      // The first request goes out on the proxy's own keep-alive path, which relays a plain answer itself.
      const firstSend = (start: PayStart): Promise<FirstAnswer> => sendFirst(this.origins, conn, start, dest, requestHead(method, path, host, start), method)
      const out = await this.d.engine.pay(payReq, { firstSend })
      if ('relayed' in out) {
        status = out.status
        return
      }
      const a = this.answerOf(out)
      ;({ status, paid, errorCode } = a)
      await writeAnswer(conn, method, status, a.headers, out.response.body)
    } catch (e) {
      const err = this.failure(e, agentId)
      errorCode = err.code
      status = err.status
      await this.writeError(conn, method, err)
    } finally {
      this.logRequest(agentId, method, host, status, paid, errorCode, started)
    }
  }

  private writeError(conn: FastConn, method: string, e: PaygateError): Promise<void> {
    const { headers, body } = errorAnswer(e)
    return writeAnswer(conn, method, e.status, headers, body)
  }

  // ---- CONNECT --------------------------------------------------------------------------

  private async onConnect(authority: string, headers: IncomingHttpHeaders, socket: Socket, head: Buffer): Promise<void> {
    socket.on('error', () => socket.destroy())
    this.counters.connects++
    const target = splitAuthority(authority)
    if (!target) {
      socket.end(rawAnswer(new PaygateError('invalid_request', `CONNECT needs host:port, got ${JSON.stringify(authority.slice(0, 300))}`, { field: 'request-target' })))
      return
    }
    // Read before verifying: a revocation meanwhile makes the tunnel's first request check again.
    const revision = this.d.registry.revision
    const agentId = await this.identity.of(headers)
    if (!agentId) {
      this.counters.authFailures++
      socket.end(RAW_407)
      return
    }
    const auth = headers['proxy-authorization']
    // The guard refuses at once what it can decide without resolving (IP literals in any
    // spelling, metadata and denied names, localhost on Paygate's own ports); a pass-through
    // connection resolves through it, and every connection for an intercepted tunnel asks again.
    let to: ReturnType<EgressGuard['connectOptions']> | null = null
    try {
      if (hostMatches(this.d.passThrough, target.host)) to = this.egress.connectOptions(target.host, target.port)
      else this.egress.checkNow(target.host, target.port)
    } catch (e) {
      if (!isEgressDenied(e)) throw e
      socket.end(rawAnswer(e))
      return
    }
    if (to) {
      let open = false
      const up = netConnect({ ...to, port: target.port }, () => {
        open = true
        socket.write('HTTP/1.1 200 Connection Established\r\n\r\n')
        if (head.length) up.write(head)
        socket.pipe(up).pipe(socket)
        socket.resume()
        // Idle both ways for the limit: the tunnel closes, as an intercepted one does.
        const idle = (): void => {
          socket.destroy()
          up.destroy()
        }
        socket.setTimeout(this.idleTimeoutMs, idle)
        up.setTimeout(this.idleTimeoutMs, idle)
      })
      up.on('error', (e) => {
        // Once the tunnel is up, the agent's bytes are the target's: only closing can say it broke.
        if (!open) socket.end(rawAnswer(isEgressDenied(e) ? e : new PaygateError('upstream_unreachable', `the target could not be reached: ${e.message}`)))
        else socket.destroy()
      })
      return
    }
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n')
    const first = head.length ? head : await firstChunk(socket, this.idleTimeoutMs)
    if (!first) {
      socket.destroy()
      return
    }
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
      this.startFast(tls, tunnelTo(agentId, auth, revision, 'https', target.host, target.port))
    } else {
      this.startFast(socket, tunnelTo(agentId, auth, revision, 'http', target.host, target.port), first)
    }
  }

  // ---- WebSocket upgrades ---------------------------------------------------------------

  private async onUpgrade(req: IncomingMessage, socket: Socket, head: Buffer, tunnel: Tunnel | null): Promise<void> {
    socket.on('error', () => socket.destroy())
    let origin: string
    if (tunnel) {
      if (tunnel.revision !== this.d.registry.revision && !(await this.stillHolds(tunnel))) {
        this.counters.authFailures++
        socket.end(RAW_407)
        return
      }
      const path = tunnelPath(tunnel, req.url ?? '/')
      if (path === null) {
        socket.end(rawAnswer(tunnelTargetError(tunnel)))
        return
      }
      origin = tunnel.origin
      req.url = path
    } else {
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
        socket.end(rawAnswer(new PaygateError('invalid_request', 'this is a forward proxy: send absolute-form requests (ws://host/path) or CONNECT', { field: 'request-target' })))
        return
      }
    }
    // The target's connection resolves through the egress guard (http-proxy hands `ssl` to http.request as its base options).
    const dest = new URL(origin)
    let to: ReturnType<EgressGuard['connectOptions']>
    try {
      to = this.egress.connectOptions(dest.hostname.replace(/^\[|\]$/g, ''), Number(dest.port) || (dest.protocol === 'https:' ? 443 : 80))
    } catch (e) {
      if (!isEgressDenied(e)) throw e
      socket.end(rawAnswer(e))
      return
    }
    delete req.headers['proxy-authorization']
    for (const k of Object.keys(req.headers)) if (k.startsWith('x-paygate-')) delete req.headers[k]
    if (typeof socket.bytesWritten === 'number') this.upgradeSent.set(socket, socket.bytesWritten)
    this.ws.ws(req, socket, head, { target: origin, changeOrigin: true, secure: true, ssl: { lookup: to.lookup }, ...(this.d.upstreamCa ? { ca: this.d.upstreamCa } : {}) } as never)
  }

  async close(graceMs: number): Promise<void> {
    if (!this.server.listening) return
    this.closing = true
    const closed = new Promise<void>((r) => this.server.close(() => r()))
    for (const c of this.fastConns) {
      if (c.idle) c.socket.destroy()
      else c.closeAfter = true
    }
    // Node's servers here never listen, so they track no connections: `others` does.
    const timer = setTimeout(() => {
      for (const c of this.fastConns) c.socket.destroy()
      for (const s of this.others) s.destroy()
    }, graceMs)
    await closed
    clearTimeout(timer)
    this.origins.close()
    this.ws.close()
  }
}
