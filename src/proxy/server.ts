import type { IncomingHttpHeaders, IncomingMessage } from 'node:http'
import { createServer as createNetServer, type Server, type Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import type { EgressGuard } from '../net/egress.js'
import { RequestAccounting } from './accounting.js'
import { DENIED, sendError, type Sink } from './answers.js'
import { onConnect } from './connect.js'
import type { ProxyContext, ProxyCounters, ProxyDeps } from './context.js'
import { FastConn, type FastHost, type Tunnel } from './fast.js'
import { FastRequests, route } from './fast-request.js'
import type { RequestHead } from '../upstream/http1.js'
import { ProxyIdentity } from './identity.js'
import { NodePath } from './node-path.js'
import { OriginPool } from '../upstream/origins.js'
import { replayable } from './streams.js'
import { authorizeTunnel } from './tunnel.js'
import { Upgrades } from './upgrade.js'

export type { ProxyDeps } from './context.js'

/**
 * The forward proxy: absolute-form HTTP requests and CONNECT tunnels (TLS intercepted with
 * a leaf certificate from Paygate's CA, or plain HTTP, told apart by the first byte). Every
 * request goes through the payment engine; a 402 is paid under the agent's policy. This
 * class wires the parts: the fast path (fast.ts, fast-request.ts, relay.ts), Node's HTTP
 * server for the rest (node-path.ts), CONNECT (connect.ts) and upgrades (upgrade.ts).
 */
export class ProxyServer implements FastHost, ProxyContext {
  /** The proxy port: connections start on the fast path (src/proxy/fast.ts). */
  readonly server: Server
  private readonly fastConns = new Set<FastConn>()
  /** Connections that left the fast path (handed to Node's servers, tunnels, upgrades): cut at shutdown after the grace period. */
  private readonly others = new Set<Socket>()
  private readonly origins: OriginPool
  private closing = false
  readonly identity: ProxyIdentity
  readonly egress: EgressGuard
  readonly counters: ProxyCounters = { requests: 0, authFailures: 0, tunnels: 0 }
  readonly idleTimeoutMs: number
  private readonly fast: FastRequests
  private readonly accounting: RequestAccounting
  private readonly node: NodePath
  private readonly upgrades: Upgrades

  constructor(readonly d: ProxyDeps) {
    this.identity = new ProxyIdentity(d.registry, d.defaultAgent)
    this.egress = d.upstream.egress
    this.origins = new OriginPool(d.upstream.secureContext, this.egress, d.upstream.timeoutMs)
    this.idleTimeoutMs = d.idleTimeoutMs ?? 65_000
    const accounting = (this.accounting = new RequestAccounting(d.log, d.accessLog, this.counters))
    this.fast = new FastRequests(this, accounting, this.origins)
    this.upgrades = new Upgrades(this)
    this.node = new NodePath(this, accounting, {
      connect: (req, socket, head) => onConnect(this, req.url ?? '', req.headers, socket, head),
      upgrade: (req, socket, head, tunnel) => this.upgrades.handle(req, socket, head, tunnel),
      guard: (p, socket) => this.guard(p, socket),
    })
    // allowHalfOpen: an agent that half-closes after its request still gets the answer.
    this.server = createNetServer({ noDelay: true, allowHalfOpen: true }, (socket) => this.startFast(socket, null))
  }

  /** Connections open now: on the fast path, and those that left it (Node's servers, tunnels, upgrades). */
  get connections(): number {
    return this.fastConns.size + this.others.size
  }

  /** The leaf-certificate cache's hits and misses (and size). */
  leafCache(): ReturnType<ProxyDeps['ca']['stats']> {
    return this.d.ca.stats()
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

  deny(to: Sink, close = false, method?: string, host?: string): Promise<void> {
    this.counters.authFailures++
    this.accounting.denied(method, host)
    return sendError(to, DENIED, close)
  }

  authorizeTunnel(t: Tunnel): true | Promise<boolean> {
    return authorizeTunnel(t, this.d.registry, this.identity)
  }

  // ---- the fast path (FastHost) -------------------------------------------------------------

  startFast(socket: Socket, tunnel: Tunnel | null, initial: Buffer | null = null): void {
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
    return route(head, conn)
  }

  serve(conn: FastConn, head: RequestHead): Promise<void> {
    return this.fast.serve(conn, head)
  }

  handoff(conn: FastConn, pending: Buffer): void {
    this.hold(conn.socket)
    const stream = replayable(conn.socket, pending)
    if (conn.tunnel) {
      this.node.tunnels.set(stream, conn.tunnel)
      this.node.inner.emit('connection', stream)
    } else this.node.http.emit('connection', stream)
  }

  takeover(conn: FastConn, head: RequestHead, rest: Buffer): void {
    this.hold(conn.socket)
    const headers = { ...head.map } as IncomingHttpHeaders
    if (head.method === 'CONNECT') {
      this.guard(onConnect(this, head.target, headers, conn.socket, rest), conn.socket)
      return
    }
    // An upgrade: http-proxy reads only these fields of the request.
    const req = { method: head.method, url: head.target, headers, httpVersion: '1.1', httpVersionMajor: 1, httpVersionMinor: 1, rawHeaders: head.raw } as unknown as IncomingMessage
    this.guard(this.upgrades.handle(req, conn.socket, rest, conn.tunnel), conn.socket)
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
    this.upgrades.close()
  }
}
