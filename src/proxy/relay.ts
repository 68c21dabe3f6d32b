import { STATUS_CODES, type OutgoingHttpHeaders } from 'node:http'
import { Readable } from 'node:stream'
import { relayable, type FirstAnswer, type PayStart } from '../engine/engine.js'
import { type UpstreamError, unreachableError } from '../upstream/errors.js'
import { PaygateError } from '../errors/index.js'
import type { FastConn } from './fast.js'
import { relayResponseHead, type Framing, type ResponseHead } from '../upstream/http1.js'
import { ExchangeBody, type Exchange, type ExchangeSink, type Origin, type OriginPool } from '../upstream/origins.js'

/** What the first send on the fast path came to (`fallback`: a response it leaves alone; the engine asks again on its own client, the method being idempotent). */
export type FirstSend = FirstAnswer

/** The request head for the target: origin-form, Host from the URL, the engine's headers. */
export function requestHead(method: string, path: string, authority: string, start: PayStart): string {
  let out = `${method} ${path} HTTP/1.1\r\nhost: ${authority}\r\n`
  const h = start.req.headers
  for (const k in h) out += `${k}: ${h[k]}\r\n`
  for (const k in start.firstHeaders) out += `${k}: ${start.firstHeaders[k]}\r\n`
  return `${out}\r\n`
}

/**
 * The first send on the proxy's own keep-alive connection. An answer the engine has no
 * business with (no 402, no MPP session used) is relayed to the agent byte for byte as it
 * arrives; anything else becomes an UpstreamResponse for the engine. A class rather than
 * closures: this runs for every proxied request.
 */
class FirstSendSink implements ExchangeSink {
  private mode: 'wait' | 'relay' | 'engine' = 'wait'
  private status = 0
  private body: ExchangeBody | null = null
  /** The relayed head, written with the first body bytes: one plain write rather than a writev. */
  private headText: string | null = null
  private retried = false
  private exchange!: Exchange

  constructor(
    private readonly pool: OriginPool,
    private readonly conn: FastConn,
    private readonly start: PayStart,
    private readonly dest: Origin,
    private readonly request: string,
    private readonly method: string,
    private readonly resolve: (r: FirstSend) => void,
    private readonly reject: (e: Error) => void,
  ) {}

  send(fresh: boolean): void {
    this.exchange = this.pool.request(this.dest, this.request, this.method, this, fresh)
  }

  /** The agent went away. */
  gone(): void {
    this.exchange.abort()
    if (this.mode === 'engine') this.body!.destroy()
    else this.resolve({ kind: 'relayed', status: 0 })
  }

  head(head: ResponseHead | null, framing: Framing | null): boolean {
    if (!head || !framing) {
      this.resolve({ kind: 'fallback' })
      return false
    }
    if (relayable(this.start, head.status)) {
      this.mode = 'relay'
      this.status = head.status
      if (!this.conn.alive) {
        this.exchange.abort()
        this.resolve({ kind: 'relayed', status: 0 })
        return false
      }
      // A body that ends with the target's connection ends the agent's too.
      if (framing.kind === 'close') this.conn.closeAfter = true
      this.headText = relayResponseHead(head, this.conn.closeAfter)
      return false
    }
    // The engine reads the body itself, so it gets it without the chunked framing.
    this.mode = 'engine'
    this.body = new ExchangeBody(this.exchange)
    this.resolve({ kind: 'engine', response: { status: head.status, headers: head.map, body: this.body } })
    return true
  }

  data(chunk: Buffer, transient: boolean): boolean {
    if (this.mode === 'engine') return this.body!.push(transient ? Buffer.from(chunk) : chunk)
    let out = chunk
    if (this.headText !== null) {
      out = withHead(this.headText, chunk)
      this.headText = null
    } else if (transient) out = Buffer.from(chunk)
    if (this.conn.socket.write(out)) return true
    this.conn.socket.once('drain', () => this.exchange.resume())
    return false
  }

  end(): void {
    if (this.mode === 'engine') return void this.body!.push(null)
    this.flush()
    this.resolve({ kind: 'relayed', status: this.status })
  }

  flush(): void {
    if (this.headText === null) return
    // A head without body bytes yet (or none at all): it goes now.
    this.conn.socket.write(this.headText, 'latin1')
    this.headText = null
  }

  error(e: UpstreamError | PaygateError, stale: boolean): void {
    if (this.mode === 'wait') {
      // A pooled connection the target had closed: once more on a new one (the method is idempotent).
      if (stale && !this.retried) {
        this.retried = true
        try {
          return this.send(true)
        } catch (again) {
          return this.reject(again as Error)
        }
      }
      // The egress guard's refusal (403 egress_denied) as it is.
      return this.reject(e instanceof PaygateError ? e : unreachableError(e))
    }
    if (this.mode === 'engine') return void this.body!.destroy(e)
    // Mid-relay: the agent has part of an answer, so only closing tells it something broke.
    this.conn.socket.destroy()
    this.resolve({ kind: 'relayed', status: this.status })
  }
}

export function sendFirst(pool: OriginPool, conn: FastConn, start: PayStart, dest: Origin, head: string, method: string): Promise<FirstSend> {
  return new Promise<FirstSend>((resolve, reject) => {
    if (!conn.alive) return resolve({ kind: 'relayed', status: 0 })
    const sink = new FirstSendSink(pool, conn, start, dest, head, method, resolve, reject)
    // The egress guard's refusal of an IP literal is thrown here: it rejects this promise.
    sink.send(false)
    conn.onGone = () => sink.gone()
  })
}

/**
 * Head and body bytes in one buffer, for one write() syscall: a corked head + body goes
 * out as a writev, which measured ~25% more CPU per proxied request here.
 */
function withHead(head: string, body: Buffer): Buffer {
  const n = Buffer.byteLength(head, 'latin1')
  const out = Buffer.allocUnsafe(n + body.length)
  out.write(head, 0, 'latin1')
  body.copy(out, n)
  return out
}

/** The head of an answer Paygate composed itself. */
function answerHead(status: number, headers: OutgoingHttpHeaders, chunked: boolean, close: boolean): string {
  let out = `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\n`
  for (const k in headers) {
    const v = headers[k]
    if (v === undefined) continue
    if (Array.isArray(v)) for (const x of v) out += `${k}: ${x}\r\n`
    else out += `${k}: ${v}\r\n`
  }
  if (chunked) out += 'transfer-encoding: chunked\r\n'
  if (close) out += 'connection: close\r\n'
  return `${out}\r\n`
}

const CRLF = Buffer.from('\r\n')
const LAST_CHUNK = Buffer.from('0\r\n\r\n')

const noBodyAnswer = (method: string, status: number): boolean => method === 'HEAD' || status === 204 || status === 304 || status < 200

/** Write an answer Paygate composed (engine outcomes, errors) on a fast-path connection, with backpressure. */
export async function writeAnswer(conn: FastConn, method: string, status: number, headers: OutgoingHttpHeaders, body: Readable | Buffer | null): Promise<void> {
  const socket = conn.socket
  if (!conn.alive) {
    if (body instanceof Readable) body.destroy()
    return
  }
  const noBody = noBodyAnswer(method, status)
  const chunked = !noBody && headers['content-length'] === undefined
  let head: string | null = answerHead(status, headers, chunked, conn.closeAfter)
  if (noBody || body === null) {
    if (body instanceof Readable) body.destroy()
    socket.write(chunked ? `${head}0\r\n\r\n` : head, 'latin1')
    return
  }
  const frame = (c: Buffer): Buffer => (chunked ? Buffer.concat([Buffer.from(`${c.length.toString(16)}\r\n`), c, CRLF]) : c)
  if (Buffer.isBuffer(body)) {
    socket.write(withHead(head, chunked ? Buffer.concat([frame(body), LAST_CHUNK]) : body))
    return
  }
  const gone = new Promise<void>((r) => (conn.onGone = r))
  try {
    for await (const c of body as AsyncIterable<Buffer>) {
      if (!c.length) continue
      const ok = socket.write(head === null ? frame(c) : withHead(head, frame(c)))
      head = null
      if (!ok) await Promise.race([new Promise((r) => socket.once('drain', r)), gone])
      if (!conn.alive) {
        body.destroy()
        return
      }
    }
    if (head !== null) socket.write(head, 'latin1')
    if (chunked) socket.write(LAST_CHUNK)
  } catch {
    // The target's body broke off: the agent can only learn it from the connection closing.
    socket.destroy()
  }
}
