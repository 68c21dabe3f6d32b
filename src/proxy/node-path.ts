import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { Duplex, Readable } from 'node:stream'
import { unreachable } from '../upstream/errors.js'
import { errorBytes, parserRefusal } from '../errors/http.js'
import { RequestTimeoutError, toPaygateError } from '../errors/index.js'
import { collectUpTo } from '../util/collect.js'
import { endLingering } from '../util/linger.js'
import { answerOf, type RequestAccounting, type Accounted } from './accounting.js'
import { notAbsolute, sendError } from './answers.js'
import type { ProxyContext } from './context.js'
import type { Tunnel } from './fast.js'
import { forwardRequestHeaders, forwardResponseHeaders, headerValue } from './headers.js'
import { idempotent } from './idempotent.js'
import { byDeadline, onward, relay } from './streams.js'
import { tunnelPath, tunnelTargetError } from './tunnel.js'

/** What Node's servers hand back to the proxy: a CONNECT, and upgrades (outside and inside tunnels). */
export interface NodePathEvents {
  connect(req: IncomingMessage, socket: Socket, head: Buffer): Promise<void>
  upgrade(req: IncomingMessage, socket: Socket, head: Buffer, tunnel: Tunnel | null): Promise<void>
  /** A handler's failure that escaped its own handling: logged, the connection closed. */
  guard(p: Promise<void>, socket: Duplex): void
}

/**
 * Requests handed off the fast path to Node's HTTP server (bodies, HTTP/1.0, odd syntax):
 * absolute-form ones on `http`, and those inside CONNECT tunnels on `inner`.
 */
export class NodePath {
  /** Node's HTTP server for connections handed off the fast path. */
  readonly http: HttpServer
  /** The same for requests inside CONNECT tunnels. */
  readonly inner: HttpServer
  /** Each stream handed to `inner`, and its tunnel. */
  readonly tunnels = new WeakMap<object, Tunnel>()
  /** Per connection: responses under way, and a parser refusal to answer once they are done. */
  private readonly inFlight = new WeakMap<Duplex, { responses: number; refused?: () => void }>()

  constructor(
    private readonly ctx: ProxyContext,
    private readonly accounting: RequestAccounting,
    on: NodePathEvents,
  ) {
    this.http = createServer({ keepAliveTimeout: ctx.idleTimeoutMs })
    this.inner = createServer({ keepAliveTimeout: ctx.idleTimeoutMs })
    for (const s of [this.http, this.inner]) {
      s.on('request', (req: IncomingMessage, res: ServerResponse) => this.track(req.socket, res))
      s.on('clientError', (e: NodeJS.ErrnoException, socket: Duplex) => this.refuse(e, socket))
    }
    this.http.on('request', (req, res) => on.guard(this.onRequest(req, res), req.socket))
    this.http.on('connect', (req: IncomingMessage, socket: Socket, head: Buffer) => on.guard(on.connect(req, socket, head), socket))
    this.http.on('upgrade', (req, socket: Socket, head: Buffer) => on.guard(on.upgrade(req, socket, head, null), socket))
    this.inner.on('request', (req, res) => on.guard(this.onTunnelRequest(req, res), req.socket))
    this.inner.on('upgrade', (req, socket: Socket, head: Buffer) => on.guard(on.upgrade(req, socket, head, this.tunnels.get(req.socket) ?? null), socket))
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
      endLingering(socket, errorBytes(error, status))
    }
    const f = flight ?? { responses: 0 }
    this.inFlight.set(socket, f)
    if (f.responses) f.refused = answer
    else {
      f.refused = () => {}
      answer()
    }
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let url: URL
    try {
      url = new URL(req.url ?? '')
      if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error('scheme')
    } catch {
      return sendError(res, notAbsolute('http://host/path'))
    }
    const agentId = await this.ctx.identity.of(req.headers)
    if (!agentId) return this.ctx.deny(res, false, req.method, url.host)
    await this.handle(req, res, agentId, url.href, url.host)
  }

  private async onTunnelRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const t = this.tunnels.get(req.socket)
    if (!t) return sendError(res, toPaygateError(new Error('a request on the tunnels server outside any tunnel')))
    const held = this.ctx.authorizeTunnel(t)
    if (held !== true && !(await held)) return this.ctx.deny(res, true)
    const path = tunnelPath(t, req.url ?? '/')
    if (path === null) return sendError(res, tunnelTargetError(t))
    await this.handle(req, res, t.agentId, t.origin + path, t.authority)
  }

  /** Buffer the request body up to the limit; past it, return a stream of all of it. */
  private async requestBody(req: IncomingMessage): Promise<{ body: Buffer | Readable | null; buffered: boolean }> {
    const { maxBufferBytes, bufferTimeoutMs } = this.ctx.d
    const declared = req.headers['content-length'] !== undefined ? Number(req.headers['content-length']) : null
    const chunked = req.headers['transfer-encoding'] !== undefined
    if (!chunked && (declared === null || declared === 0)) return { body: null, buffered: true }
    if (declared !== null && declared > maxBufferBytes) return { body: onward(req, Buffer.alloc(0)), buffered: false }
    const ms = bufferTimeoutMs ?? 30_000
    const { head, rest } = await byDeadline(collectUpTo(req, maxBufferBytes), ms, `the request body was not received within ${ms} ms`)
    return rest ? { body: onward(req, head), buffered: false } : { body: head, buffered: true }
  }

  private handle(req: IncomingMessage, res: ServerResponse, agentId: string, url: string, host: string): Promise<void> {
    const method = req.method ?? 'GET'
    const serve = async (a: Accounted): Promise<void> => {
      const headers = forwardRequestHeaders(req.headers)
      const { body, buffered } = await this.requestBody(req)
      if (!buffered) return this.streamOnce(res, { url, method, headers, body: body as Readable }, a)
      const parentTxHash = headerValue(req.headers, 'x-paygate-parent-tx')
      // X-Paygate-Invocation joins an open invocation's tree (the header, like every X-Paygate-*, never leaves Paygate).
      const invocation = headerValue(req.headers, 'x-paygate-invocation')
      const payReq = { agentId, url, method, headers, body: body as Buffer | null, ...(parentTxHash ? { parentTxHash } : {}), ...(invocation !== undefined ? { invocation } : {}) }
      const key = headerValue(req.headers, 'x-paygate-idempotency-key')
      const { engine, idempotency, log } = this.ctx.d
      const out = key ? await idempotent({ engine, idempotency, log }, agentId, key, payReq) : await engine.pay(payReq)
      const h = answerOf(out, a)
      res.writeHead(a.status, h)
      await relay(out.response.body, res)
    }
    return this.accounting.run(agentId, method, host, serve, async (err) => {
      await sendError(res, err)
      // A late body: its answer says the connection closes; what still trickles in is dropped meanwhile.
      if (err instanceof RequestTimeoutError) res.once('finish', () => endLingering(req.socket))
    })
  }

  /** A body too large to resend: streamed once; a 402 goes back unpaid, saying why. */
  private async streamOnce(res: ServerResponse, r: { url: string; method: string; headers: Record<string, string>; body: Readable }, a: Accounted): Promise<void> {
    const stream = r.body
    try {
      const answer = await this.ctx.d.upstream.send(r).catch(unreachable)
      const h = forwardResponseHeaders(answer.headers)
      if (answer.status === 402) h['x-paygate-error'] = a.error = 'request_body_too_large'
      a.status = answer.status
      res.writeHead(answer.status, h)
      await relay(answer.body, res)
    } finally {
      // What the target did not read is dropped, so the agent's connection stays in step.
      if (!stream.readableEnded) stream.destroy()
    }
  }
}
