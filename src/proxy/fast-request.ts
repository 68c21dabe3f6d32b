import type { IncomingHttpHeaders } from 'node:http'
import type { FirstAnswer, PayRequest, PayStart } from '../engine/engine.js'
import { answerOf, type RequestAccounting } from './accounting.js'
import { notAbsolute, type Sink, sendError } from './answers.js'
import type { ProxyContext } from './context.js'
import type { FastConn } from './fast.js'
import { forwardRequestHeaders } from './headers.js'
import { hasConnectionToken, httpTarget, type RequestHead } from '../upstream/http1.js'
import type { Origin, OriginPool } from '../upstream/origins.js'
import { requestHead, sendFirst, writeAnswer } from './relay.js'

/** Safe (RFC 9110 §9.2.1), so sending one again is harmless, and without a body: the methods the fast path serves. */
const FAST_METHODS = new Set(['GET', 'HEAD', 'OPTIONS'])

/** Where a parsed head goes: served here, the socket taken over (CONNECT, upgrades), or the connection handed to Node's server. */
export function route(head: RequestHead, conn: FastConn): 'fast' | 'takeover' | 'node' {
  if (head.method === 'CONNECT') return conn.tunnel ? 'node' : 'takeover'
  const m = head.map
  if (m.upgrade !== undefined) {
    const upgrade = head.method === 'GET' && hasConnectionToken(m.connection, 'upgrade') && m['content-length'] === undefined && m['transfer-encoding'] === undefined
    return upgrade ? 'takeover' : 'node'
  }
  if (!FAST_METHODS.has(head.method) || m.host === undefined || m['transfer-encoding'] !== undefined || m.expect !== undefined) return 'node'
  if (m['content-length'] !== undefined && m['content-length'] !== '0') return 'node'
  if (m['x-paygate-idempotency-key'] !== undefined || m['x-paygate-parent-tx'] !== undefined || m['x-paygate-invocation'] !== undefined) return 'node'
  return (conn.tunnel ? head.target.startsWith('/') : head.target.startsWith('http://')) ? 'fast' : 'node'
}

/** A request's agent and target, once known. */
interface Target {
  agentId: string
  url: string
  host: string
  dest: Origin
  path: string
  origin: string
}

/** Requests served on the fast path: identity, the engine's lookups, the first send on the proxy's own connection, then relay or pay. */
export class FastRequests {
  constructor(
    private readonly ctx: ProxyContext,
    private readonly accounting: RequestAccounting,
    private readonly origins: OriginPool,
  ) {}

  async serve(conn: FastConn, head: RequestHead): Promise<void> {
    const found = this.target(conn, head)
    const t = found instanceof Promise ? await found : found
    if (!t) return
    const { method } = head
    const sink = { conn, method }
    return this.accounting.run(
      t.agentId,
      method,
      t.host,
      async (a) => {
        const { engine } = this.ctx.d
        const payReq: PayRequest = { agentId: t.agentId, url: t.url, origin: t.origin, method, headers: forwardRequestHeaders(head.map as IncomingHttpHeaders, engine.acceptPayment), body: null }
        // The first request goes out on the proxy's own keep-alive path, which relays a plain answer itself.
        const firstSend = (start: PayStart): Promise<FirstAnswer> => sendFirst(this.origins, conn, start, t.dest, requestHead(method, t.path, t.host, start), method)
        const out = await engine.pay(payReq, { firstSend })
        if ('relayed' in out) {
          a.status = out.status
          return
        }
        const headers = answerOf(out, a)
        await writeAnswer(conn, method, a.status, headers, out.response.body)
      },
      (err) => sendError(sink, err),
    )
  }

  /**
   * The agent and target of a request, or null once it is answered (407, a target the proxy
   * does not serve). Without an await while the tunnel or the credential is known: this runs per request.
   */
  private target(conn: FastConn, head: RequestHead): Target | null | Promise<Target | null> {
    const sink = { conn, method: head.method }
    const t = conn.tunnel
    if (t) {
      const held = this.ctx.authorizeTunnel(t)
      const inTunnel = (): Target => ({ agentId: t.agentId, url: t.origin + head.target, host: t.authority, dest: t.dest, path: head.target, origin: t.origin })
      if (held === true) return inTunnel()
      // The key was revoked since CONNECT: the 407 a new connection would get, then the tunnel ends.
      return held.then((ok) => (ok ? inTunnel() : this.ctx.deny(sink, true, head.method, t.authority).then(() => null)))
    }
    const headers = head.map as IncomingHttpHeaders
    const known = this.ctx.identity.known(headers)
    if (known !== undefined) return this.absolute(known, sink, head.target)
    return this.ctx.identity.of(headers).then((id) => this.absolute(id, sink, head.target))
  }

  private absolute(agentId: string | null, sink: Sink & { method: string }, requestTarget: string): Target | Promise<null> {
    const target = httpTarget(requestTarget)
    if (!agentId) return this.ctx.deny(sink, false, sink.method, target?.authority).then(() => null)
    if (!target) return sendError(sink, notAbsolute('http://host/path')).then(() => null)
    const dest = { https: false, host: target.hostname, port: target.port }
    return { agentId, url: target.href, host: target.authority, dest, path: target.path, origin: `http://${target.authority}` }
  }
}
