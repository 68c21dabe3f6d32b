import { X509Certificate } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createSecureContext, rootCertificates, type SecureContext } from 'node:tls'
import { Readable } from 'node:stream'
import { Agent, buildConnector, util, type Dispatcher } from 'undici'
import { PaygateError } from '../errors/index.js'
import type { EgressGuard } from '../net/egress.js'
import { collect, type Deadline } from '../util/collect.js'
import { remembered } from '../util/lru.js'
import { UpstreamError, upstreamError } from './errors.js'
import { type Origin, OriginPool } from './origins.js'
import { pooledHead, pooledSend } from './pooled.js'

/** undici lives here: pooled keep-alive upstream connections, no redirect following (body-less GET and HEAD go on OriginPool: pooled.ts). */
export interface UpstreamRequest {
  url: string
  method: string
  headers: Record<string, string>
  /** A buffer (resendable) or a stream (sent once, e.g. a proxied body over the buffer limit). */
  body: Buffer | Readable | null
  /** Abort the attempt after this many ms without response headers. */
  timeoutMs?: number
}

export interface UpstreamResponse {
  status: number
  headers: Record<string, string | string[] | undefined>
  body: Readable
}

/** A response body fed by the dispatcher: reading resumes the upstream socket, destroying it early aborts the request. */
class ResponseBody extends Readable {
  /** Every byte has arrived (as IncomingMessage's `complete`): a reader may take them at once (collectUpTo). */
  complete = false

  constructor(
    private readonly resumeUpstream: () => void,
    private readonly abortUpstream: (e?: Error) => void,
  ) {
    super()
  }

  override _read(): void {
    this.resumeUpstream()
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    if (!this.readableEnded) this.abortUpstream(err ?? undefined)
    cb(err)
  }
}

const noop = (): void => {}

/** One request's callbacks from undici's HTTP/1 client: the raw dispatch interface, without `request()`'s per-call machinery. */
class Handler implements Dispatcher.DispatchHandler {
  private body: ResponseBody | null = null
  private abort: (e?: Error) => void = noop

  constructor(
    private readonly requestBody: UpstreamRequest['body'],
    private readonly resolve: (r: UpstreamResponse) => void,
    private readonly reject: (e: Error) => void,
  ) {}

  onConnect(abort: (e?: Error) => void): void {
    this.abort = abort
  }

  onHeaders(status: number, raw: Buffer[], resume: () => void): boolean {
    if (status < 200) return true // 1xx: wait for the final answer
    this.body = new ResponseBody(resume, this.abort)
    this.resolve({ status, headers: util.parseHeaders(raw), body: this.body })
    return true
  }

  onData(chunk: Buffer): boolean {
    return this.body!.push(chunk)
  }

  onComplete(): void {
    this.body!.complete = true
    this.body!.push(null)
  }

  /** As request() does: a streamed request body stops, and a response body errors once its reader has had a chance to listen. */
  onError(e: Error): void {
    if (this.requestBody instanceof Readable) this.requestBody.on('error', noop).destroy(e)
    const body = this.body
    if (!body) return this.reject(upstreamError(e))
    queueMicrotask(() => body.on('error', noop).destroy(e))
  }
}

interface Target {
  origin: string
  path: string
  /** For the pooled path: the connection's origin (http or https only; null: undici's) and the Host header. */
  pooled: Readonly<Origin> | null
  authority: string
}
/** Where a request goes (agents call the same few URLs over and over: one parse each). */
const targetOf = remembered((s: string): Target => {
  const u = new URL(s)
  const https = u.protocol === 'https:'
  const host = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname
  const pooled = https || u.protocol === 'http:' ? Object.freeze({ https, host, port: u.port ? Number(u.port) : https ? 443 : 80 }) : null
  return Object.freeze({ origin: u.origin, path: u.pathname + u.search, pooled, authority: u.host })
})

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g

/**
 * undici's connector behind the egress guard: the origin's name is resolved once and checked
 * (every address), then the connection goes to a checked address, the next one if it fails;
 * TLS keeps the name for SNI and verification (undici derives it from the origin), the
 * request its Host.
 */
function guardedConnector(egress: EgressGuard, base: buildConnector.connector): buildConnector.connector {
  return (opts, callback) => {
    const port = Number(opts.port) || (opts.protocol === 'https:' ? 443 : 80)
    egress.check(opts.hostname, port).then(
      (addresses) => {
        let i = 0
        const next = (): void => {
          const a = addresses[i++]!
          base({ ...opts, hostname: a.address }, (err, socket) => {
            if (err && i < addresses.length) return next()
            if (err) return callback(err, null)
            callback(null, socket!)
          })
        }
        next()
      },
      (e: Error) => callback(e, null),
    )
  }
}

export class Upstream {
  readonly dispatcher: Agent
  /** Keep-alive connections for body-less GET and HEAD sends (pooled.ts); undici takes the rest. */
  private readonly pool: OriginPool
  /** Upstream TLS trust, shared with the proxy's own connections; undefined: the system roots. */
  readonly secureContext: SecureContext | undefined

  /** Upstream TLS trusts the system roots plus the PEM bundle in `caFile`; every new connection asks `egress` first. */
  constructor(
    caFile: string | null,
    readonly egress: EgressGuard,
    readonly timeoutMs = 30_000,
  ) {
    let ca: string[] | undefined
    if (caFile) {
      let extra: string
      try {
        extra = readFileSync(caFile, 'utf8')
      } catch (e) {
        throw new PaygateError('invalid_config', `upstream.caFile ${caFile} cannot be read: ${(e as Error).message}`)
      }
      // A file with no certificate in it (a wrong path, a key file) would be ignored silently.
      const pems = extra.match(PEM_CERT) ?? []
      if (!pems.length) throw new PaygateError('invalid_config', `upstream.caFile ${caFile} holds no PEM certificate (-----BEGIN CERTIFICATE-----)`)
      for (const pem of pems) {
        try {
          new X509Certificate(pem)
        } catch (e) {
          throw new PaygateError('invalid_config', `upstream.caFile ${caFile} holds a certificate that cannot be read: ${(e as Error).message}`)
        }
      }
      ca = [...rootCertificates, extra]
    }
    // One TLS context for every upstream connection: passing `ca` would re-parse ~140 roots per connection (~30 ms of blocked loop).
    const secureContext = ca ? createSecureContext({ ca }) : undefined
    this.secureContext = secureContext
    const base = buildConnector({ timeout: 10_000, ...(secureContext ? { secureContext } : {}) })
    this.dispatcher = new Agent({ keepAliveTimeout: 30_000, connections: 256, connect: guardedConnector(egress, base) })
    this.pool = new OriginPool(secureContext, egress, timeoutMs)
  }

  /**
   * On undici's `dispatch()` rather than `request()`: same pool, timeouts and errors, about
   * 35 µs less CPU per request (request() adds an AsyncResource, abort-signal plumbing and
   * a body class per call), which is most of a passthrough's cost.
   */
  send(req: UpstreamRequest): Promise<UpstreamResponse> {
    const timeout = req.timeoutMs ?? this.timeoutMs
    let url: Target
    try {
      url = targetOf(req.url)
    } catch {
      return Promise.reject(new UpstreamError('network', `upstream request failed: invalid URL ${req.url}`))
    }
    // Body-less GET and HEAD on the pooled path, when its one inactivity limit is the one asked for.
    if (req.body === null && url.pooled && (req.method === 'GET' || req.method === 'HEAD') && timeout === this.timeoutMs) {
      const head = pooledHead(req.method, url.path, url.authority, req.headers)
      if (head !== null) return pooledSend(this.pool, url.pooled, head, req.method)
    }
    return new Promise((resolve, reject) => {
      this.dispatcher.dispatch(
        { origin: url.origin, path: url.path, method: req.method as Dispatcher.HttpMethod, headers: req.headers, body: req.body, headersTimeout: timeout, bodyTimeout: timeout },
        new Handler(req.body, resolve, reject),
      )
    })
  }

  /**
   * At shutdown, once the listeners have drained: what is still in flight (a sub-agent that has
   * not answered, a slow target) is cut, as the pooled connections' sends are, so its handler
   * ends now, while the store and the outbox are open, rather than keeping the process up to
   * `invoke.timeoutMs` past `shutdown.graceMs`. A payment cut so is settled by its outcome as any
   * failed send is (from the chain, or by the reconciler).
   */
  async close(): Promise<void> {
    this.pool.close()
    await this.dispatcher.destroy()
  }
}

/** The whole-body limit for answers Paygate reads itself (402s, refusals): a target dripping one cannot hold a payment open. */
export const bodyDeadline = (ms: number): Deadline => ({ ms, error: () => new UpstreamError('timeout', `the target's answer body did not arrive within ${ms} ms`) })

/** Read a body into memory up to `max` bytes, within `deadlineMs`; more is an error (402 bodies are small). */
export function readBody(body: Readable, max: number, deadlineMs = 30_000): Promise<Buffer> {
  return collect(body, max, () => new PaygateError('payment_protocol_error', `the 402 answer body exceeds ${max} bytes`), undefined, bodyDeadline(deadlineMs))
}
