import type { Socket } from 'node:net'
import type { Origin } from '../upstream/origins.js'
import { hasConnectionToken, headEnd, MAX_HEAD, parseRequestHead, type RequestHead } from '../upstream/http1.js'

/** What the proxy does with one parsed request head on the fast path. */
export interface FastHost {
  /** `fast`: serve it here; `takeover`: the socket leaves HTTP (CONNECT, upgrades); `node`: hand the connection to Node's HTTP server. */
  route(head: RequestHead, conn: FastConn): 'fast' | 'takeover' | 'node'
  /** Answer one request; settles once the answer is written or abandoned. */
  serve(conn: FastConn, head: RequestHead): Promise<void>
  /** The connection leaves the fast path: from `pending` on, Node's parser reads it. */
  handoff(conn: FastConn, pending: Buffer): void
  /** A CONNECT or an upgrade: the socket, detached and paused, plus the bytes after the head. */
  takeover(conn: FastConn, head: RequestHead, rest: Buffer): void
  /** The connection closed or left the fast path. */
  forget(conn: FastConn): void
  /** Keep-alive idle limit: a connection with no request in flight for this long is closed. */
  readonly idleTimeoutMs: number
}

/** A CONNECT tunnel's agent and target, as `scheme://host[:port]` and `host[:port]` (computed once, used per request). */
export interface Tunnel {
  agentId: string
  origin: string
  authority: string
  dest: Origin
  /** The CONNECT's Proxy-Authorization (undefined: the sidecar default agent), checked again after a revocation. */
  auth: string | undefined
  /** The registry's revision when `auth` was last verified: while it stands, nothing was revoked since. */
  revision: number
}

/** The time a request head may take to arrive (as Node's server). */
const HEADERS_TIMEOUT_MS = 60_000
/** Pipelined bytes held while an answer is being written; past this the agent is paused. */
const MAX_PENDING = 64 * 1024

/**
 * One agent connection on the fast path: request heads are parsed here, one request at a
 * time (pipelined ones wait), and anything outside the fast path's subset (bodies,
 * upgrades, HTTP/1.0, odd syntax) hands the connection to Node's HTTP server for good.
 */
export class FastConn {
  private pending: Buffer | null = null
  private busy = false
  private gone = false
  private headStarted = 0
  /** The agent asked to close after this answer (or the proxy is shutting down). */
  closeAfter = false
  /** Called once if the agent goes away while an answer is in flight. */
  onGone: (() => void) | null = null

  private readonly onData = (d: Buffer): void => {
    this.pending = this.pending ? Buffer.concat([this.pending, d]) : d
    if (this.busy) {
      if (this.pending.length > MAX_PENDING) this.socket.pause()
      return
    }
    this.next()
  }

  private readonly onEnd = (): void => {
    // Half-closed by the agent: finish the answer in flight, then close.
    this.closeAfter = true
    if (!this.busy) this.socket.end()
  }

  private readonly onClose = (): void => {
    this.gone = true
    this.host.forget(this)
    const g = this.onGone
    this.onGone = null
    g?.()
  }

  private readonly onError = (): void => {
    this.socket.destroy()
  }

  private readonly onTimeout = (): void => {
    if (!this.busy) this.socket.destroy()
  }

  constructor(
    readonly socket: Socket,
    private readonly host: FastHost,
    /** Set inside a CONNECT tunnel: its agent and target. */
    readonly tunnel: Tunnel | null = null,
    /** Bytes already read from the socket (a plain-HTTP tunnel's first chunk). */
    initial: Buffer | null = null,
  ) {
    this.pending = initial
    socket.on('data', this.onData)
    socket.on('end', this.onEnd)
    socket.on('close', this.onClose)
    socket.on('error', this.onError)
    socket.on('timeout', this.onTimeout)
    socket.setTimeout(host.idleTimeoutMs)
  }

  /** Start reading (and serve the bytes given at construction). */
  start(): void {
    if (this.socket.isPaused()) this.socket.resume()
    if (this.pending) this.next()
  }

  get alive(): boolean {
    return !this.gone && !this.socket.destroyed
  }

  get idle(): boolean {
    return !this.busy
  }

  private next(): void {
    const buf = this.pending
    if (!buf || this.busy || this.gone) return
    const end = headEnd(buf)
    if (end < 0) {
      if (buf.length > MAX_HEAD) return this.leave(buf)
      const now = Date.now()
      if (!this.headStarted) this.headStarted = now
      else if (now - this.headStarted > HEADERS_TIMEOUT_MS) this.socket.destroy()
      return
    }
    this.headStarted = 0
    // A whole oversized head can arrive in one read: Node's parser refuses it (431), as it would in pieces.
    if (end > MAX_HEAD) return this.leave(buf)
    const head = parseRequestHead(buf, end)
    if (!head) return this.leave(buf)
    const route = this.host.route(head, this)
    if (route === 'node') return this.leave(buf)
    this.pending = end < buf.length ? buf.subarray(end) : null
    if (route === 'takeover') {
      const rest = this.pending ?? Buffer.alloc(0)
      this.pending = null
      this.detach()
      this.host.takeover(this, head, rest)
      return
    }
    this.busy = true
    if (hasConnectionToken(head.map.connection, 'close')) this.closeAfter = true
    this.host.serve(this, head).then(
      () => this.done(),
      () => this.socket.destroy(),
    )
  }

  private done(): void {
    this.busy = false
    this.onGone = null
    if (this.gone) return
    if (this.closeAfter) {
      this.socket.end()
      return
    }
    if (this.socket.isPaused()) this.socket.resume()
    this.next()
  }

  /** Stop listening; the socket stays paused for its next owner. */
  private detach(): void {
    this.socket.pause()
    this.socket.off('data', this.onData)
    this.socket.off('end', this.onEnd)
    this.socket.off('close', this.onClose)
    this.socket.off('error', this.onError)
    this.socket.off('timeout', this.onTimeout)
    this.socket.setTimeout(0)
    this.host.forget(this)
  }

  private leave(pending: Buffer): void {
    this.pending = null
    this.detach()
    this.host.handoff(this, pending)
  }
}
