import { Readable } from 'node:stream'
import { util, type Dispatcher } from 'undici'
import { Upstream, UpstreamError, type UpstreamRequest, type UpstreamResponse } from '../engine/upstream.js'

const TIMEOUTS = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT'])

function upstreamError(e: Error): UpstreamError {
  const code = (e as { code?: string }).code ?? ''
  return TIMEOUTS.has(code) ? new UpstreamError('timeout', `upstream timed out (${code})`) : new UpstreamError('network', `upstream request failed: ${e.message}`)
}

/** A response body fed by the dispatcher: reading resumes the upstream socket, destroying it early aborts the request. */
class ResponseBody extends Readable {
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

/**
 * The engine's upstream on undici's `dispatch()` rather than `request()`: same pool, timeouts
 * and errors, about 35 µs less CPU per request (of ~180 for a passthrough before): request()
 * adds an AsyncResource, abort-signal plumbing and a body class per call.
 */
export class DispatchUpstream extends Upstream {
  constructor(
    caFile: string | null,
    private readonly timeoutMs = 30_000,
  ) {
    super(caFile, timeoutMs)
  }

  override send(req: UpstreamRequest): Promise<UpstreamResponse> {
    const timeout = req.timeoutMs ?? this.timeoutMs
    const url = new URL(req.url)
    return new Promise((resolve, reject) => {
      this.dispatcher.dispatch(
        { origin: url.origin, path: url.pathname + url.search, method: req.method as Dispatcher.HttpMethod, headers: req.headers, body: req.body, headersTimeout: timeout, bodyTimeout: timeout },
        new Handler(req.body, resolve, reject),
      )
    })
  }
}
