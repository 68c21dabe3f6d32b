import { connect as netConnect, isIP, type Socket } from 'node:net'
import { connect as tlsConnect, type SecureContext } from 'node:tls'
import { Readable } from 'node:stream'
import { UpstreamError, upstreamError } from './errors.js'
import type { PaygateError } from '../errors/index.js'
import type { EgressGuard } from '../net/egress.js'
import { BodyFramer, hasConnectionToken, headEnd, MAX_HEAD, parseResponseHead, responseFraming, type Framing, type ResponseHead } from './http1.js'

/**
 * The proxy's own keep-alive connections to targets, for the first send of a request on the
 * fast path: one request at a time per connection, the response head parsed here and the
 * body passed on as it comes (as received, or without its chunked framing when the sink
 * asks). It also carries the engine's body-less GET and HEAD sends (pooled.ts); undici
 * the rest. It exists because it costs less CPU per request than undici (about half on the
 * proxy's relays, `npm run bench peers`; `npx tsx scripts/upstream-clients.ts`).
 */

/** What an exchange reports, in order: `head`, then `data`* and `end`, or `error` at any point. */
export interface ExchangeSink {
  /**
   * `framing` null: a response the fast path leaves alone (see responseFraming; `head` is
   * null when it could not even be read strictly); the exchange has stopped. Returns true
   * to get the body decoded (chunked framing removed) rather than as it came.
   */
  head(head: ResponseHead | null, framing: Framing | null): boolean
  /**
   * false: stop reading the target until `Exchange.resume()`. `transient`: the bytes live in
   * a read buffer that is reused once this returns, so a sink that keeps or queues them
   * (a write that may not go out at once) copies them first.
   */
  data(chunk: Buffer, transient: boolean): boolean
  end(): void
  /** After each batch of bytes from the target has been passed on (a chance to write what the sink held back). */
  flush(): void
  /**
   * `stale`: a reused connection failed before any byte came back, so a resend on a new one is
   * safe for idempotent methods. A PaygateError: the egress guard refused the target (nothing was sent).
   */
  error(e: UpstreamError | PaygateError, stale: boolean): void
}

/**
 * Plain connections read into this one buffer (net's `onread`): no buffer is allocated per
 * read and no stream machinery runs, which shows in the per-request CPU. Safe because reads
 * are handled synchronously and whatever outlives the call is copied (see `transient`).
 */
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024)

/**
 * A connection the target said it keeps idle for N seconds (`Keep-Alive: timeout=N`) is reused
 * for at most N seconds less this, so that a request is not written as the target closes it
 * (as undici does: keepAliveTimeoutThreshold).
 */
const KEEP_ALIVE_MARGIN_MS = 1000
const KEEP_ALIVE_TIMEOUT = /(?:^|[\s,;])timeout\s*=\s*(\d{1,9})/i

/** The idle time a `Keep-Alive` field announces, in ms; null when it names none. */
export function keepAliveHintMs(field: string | string[] | undefined): number | null {
  const m = typeof field === 'string' ? KEEP_ALIVE_TIMEOUT.exec(field) : null
  return m ? Number(m[1]) * 1000 : null
}

class OriginConn {
  exchange: Exchange | null = null
  reused = false
  /** How long it may wait idle and still be reused (the target's Keep-Alive hint), and until when, once idle. */
  reuseForMs = Number.POSITIVE_INFINITY
  idleUntil = Number.POSITIVE_INFINITY

  constructor(
    readonly socket: Socket,
    readonly key: string,
    private readonly pool: OriginPool,
    /** Reads arrive through `onRead` into READ_BUFFER rather than as 'data' events. */
    readonly transient: boolean,
  ) {
    socket.setNoDelay(true)
    if (!transient) socket.on('data', (d: Buffer) => this.onRead(d))
    // A timeout is never "stale": the target may be working on the request, so it is not sent again.
    socket.on('timeout', () => (this.exchange ? this.exchange.fail(new UpstreamError('timeout', 'upstream timed out'), false) : socket.destroy()))
    socket.on('error', (e) => this.exchange?.fail(upstreamError(e)))
    socket.on('close', () => {
      this.pool.forget(this)
      this.exchange?.closed()
    })
  }

  /** Always true: backpressure pauses the socket itself (net's `onread` contract). */
  onRead(d: Buffer): true {
    if (this.exchange) this.exchange.onData(d)
    else this.socket.destroy()
    return true
  }
}

export class Exchange {
  private buf: Buffer | null = null
  private framer: BodyFramer | null = null
  private got = false
  private finished = false
  private keepAlive = false

  constructor(
    private readonly conn: OriginConn,
    private readonly method: string,
    private readonly sink: ExchangeSink,
    private readonly pool: OriginPool,
  ) {}

  onData(d: Buffer): void {
    this.got = true
    this.read(d)
    this.sink.flush()
  }

  private read(d: Buffer): void {
    let chunk = d
    while (!this.framer) {
      const buf = this.buf ? Buffer.concat([this.buf, chunk]) : chunk
      const end = headEnd(buf)
      if (end < 0) {
        if (buf.length > MAX_HEAD) return this.fail(new UpstreamError('network', 'upstream response head too large'))
        this.buf = buf === chunk && this.conn.transient ? Buffer.from(buf) : buf
        return
      }
      this.buf = null
      const head = parseResponseHead(buf, end)
      // Interim answers (100, 103) are dropped: the final one follows on the same connection.
      if (head && head.status < 200 && head.status !== 101) {
        chunk = buf.subarray(end)
        if (!chunk.length) return
        continue
      }
      const framing = head && responseFraming(head, this.method)
      if (!head || !framing) {
        this.stop()
        this.sink.head(head, null)
        return
      }
      // A HEAD answer's connection is not reused: a body sent by mistake would be read as the next answer.
      this.keepAlive = head.minor === 1 && this.method !== 'HEAD' && framing.kind !== 'close' && !hasConnectionToken(head.map.connection, 'close')
      const hint = this.keepAlive ? keepAliveHintMs(head.map['keep-alive']) : null
      if (hint !== null) {
        if (hint <= KEEP_ALIVE_MARGIN_MS) this.keepAlive = false
        else this.conn.reuseForMs = hint - KEEP_ALIVE_MARGIN_MS
      }
      const decode = this.sink.head(head, framing)
      if (this.finished) return // the sink gave up on the answer
      this.framer = new BodyFramer(framing, decode && framing.kind === 'chunked')
      chunk = buf.subarray(end)
    }
    let stop: number
    try {
      stop = this.framer.feed(chunk)
    } catch (e) {
      return this.fail(new UpstreamError('network', `upstream body: ${(e as Error).message}`))
    }
    const framer = this.framer
    const transient = this.conn.transient
    if (framer.decoding) {
      let more = true
      for (const c of framer.decoded.splice(0)) more = this.sink.data(c, transient) && more
      if (stop < 0) {
        if (!more) this.conn.socket.pause()
        return
      }
    } else {
      if (stop < 0) {
        if (chunk.length && !this.sink.data(chunk, transient)) this.conn.socket.pause()
        return
      }
      if (stop > 0) this.sink.data(stop === chunk.length ? chunk : chunk.subarray(0, stop), transient)
    }
    // Bytes past the end of the answer: the target broke framing, so its connection is not reused.
    this.finish(this.keepAlive && stop === chunk.length)
  }

  resume(): void {
    if (!this.finished) this.conn.socket.resume()
  }

  /** The agent went away: drop the target's answer and its connection. */
  abort(): void {
    if (!this.finished) this.stop()
  }

  private stop(): void {
    this.finished = true
    this.conn.exchange = null
    this.conn.socket.destroy()
  }

  /** `mayResend`: false when the target may have the request (a timeout), so it is never sent twice. */
  fail(e: UpstreamError | PaygateError, mayResend = true): void {
    if (this.finished) return
    this.stop()
    this.sink.error(e, mayResend && this.conn.reused && !this.got)
  }

  /** The target closed the connection: the end of a close-delimited body, else a failure. */
  closed(): void {
    if (this.finished) return
    if (this.framer?.closeDelimited) return this.finish(false)
    this.fail(new UpstreamError('network', 'upstream request failed: the connection closed'))
  }

  private finish(reuse: boolean): void {
    if (reuse) {
      this.finished = true
      this.conn.exchange = null
      this.pool.give(this.conn)
    } else this.stop()
    this.sink.end()
  }
}

const noop = (): void => {}

/** An answer body read from an exchange, for the engine (402s, session calls, paid answers). */
export class ExchangeBody extends Readable {
  /** Every byte has arrived (as IncomingMessage's `complete`): a reader may take them at once (collectUpTo). */
  complete = false

  constructor(private readonly exchange: Exchange) {
    super()
    // The target failing while nobody reads this body (yet) must not become an uncaught error.
    this.on('error', noop)
  }

  override _read(): void {
    this.exchange.resume()
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    if (!this.readableEnded) this.exchange.abort()
    cb(err)
  }
}

export interface Origin {
  https: boolean
  /** Host name or IP (no brackets). */
  host: string
  port: number
}

export class OriginPool {
  private readonly idle = new Map<string, OriginConn[]>()
  private readonly all = new Set<OriginConn>()

  constructor(
    private readonly secureContext: SecureContext | undefined,
    /** Asked before every new connection (a reused one was asked when it was opened). */
    private readonly egress: EgressGuard,
    private readonly timeoutMs = 30_000,
    private readonly maxIdlePerOrigin = 256,
  ) {}

  /**
   * Send `head` (the whole request: the fast path carries no body) and report the answer to
   * `sink`. Throws `egress_denied` when the guard refuses an IP literal at once (a name's
   * refusal comes as the sink's error).
   */
  request(o: Origin, head: string, method: string, sink: ExchangeSink, fresh = false): Exchange {
    const key = `${o.https ? 's' : 'p'}${o.host}:${o.port}`
    const conn = (!fresh && this.reusable(key)) || this.open(o, key)
    const ex = new Exchange(conn, method, sink, this)
    conn.exchange = ex
    conn.socket.write(head, 'latin1')
    return ex
  }

  private open(o: Origin, key: string): OriginConn {
    let conn: OriginConn | null = null
    // An IP literal is checked here; a name resolves once in the guard's lookup, and the socket connects to what passed.
    const to = this.egress.connectOptions(o.host, o.port)
    const socket = o.https
      ? tlsConnect({ ...to, port: o.port, ALPNProtocols: ['http/1.1'], ...(isIP(o.host) ? {} : { servername: o.host }), ...(this.secureContext ? { secureContext: this.secureContext } : {}) })
      : netConnect({ ...to, port: o.port, onread: { buffer: READ_BUFFER, callback: (n, buf) => conn!.onRead((buf as Buffer).subarray(0, n)) } })
    // One inactivity limit for both states (answer pending: a timeout; idle: closed), set
    // once: re-arming a socket timer per request shows in the profile.
    socket.setTimeout(this.timeoutMs)
    conn = new OriginConn(socket, key, this, !o.https)
    this.all.add(conn)
    return conn
  }

  /** The newest idle connection to `key` still within its target's keep-alive time; older ones are closed. */
  private reusable(key: string): OriginConn | undefined {
    const list = this.idle.get(key)
    while (list?.length) {
      const c = list.pop()!
      if (c.idleUntil === Number.POSITIVE_INFINITY || c.idleUntil > Date.now()) return c
      c.socket.destroy()
    }
    return undefined
  }

  give(conn: OriginConn): void {
    const list = this.idle.get(conn.key) ?? []
    if (list.length >= this.maxIdlePerOrigin || conn.socket.destroyed) {
      conn.socket.destroy()
      return
    }
    conn.reused = true
    if (conn.reuseForMs !== Number.POSITIVE_INFINITY) conn.idleUntil = Date.now() + conn.reuseForMs
    if (conn.socket.isPaused()) conn.socket.resume()
    list.push(conn)
    this.idle.set(conn.key, list)
  }

  forget(conn: OriginConn): void {
    this.all.delete(conn)
    const list = this.idle.get(conn.key)
    if (!list) return
    const i = list.indexOf(conn)
    if (i >= 0) list.splice(i, 1)
    if (!list.length) this.idle.delete(conn.key)
  }

  close(): void {
    for (const c of this.all) c.socket.destroy()
    this.all.clear()
    this.idle.clear()
  }
}
