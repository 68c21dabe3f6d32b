import type { PaygateError } from '../errors/index.js'
import { UpstreamError } from './errors.js'
import { BAD_FIELD_VALUE_CHAR, HOP_BY_HOP, TOKEN, type Framing, type ResponseHead } from './http1.js'
import { ExchangeBody, type Exchange, type ExchangeSink, type Origin, type OriginPool } from './origins.js'
import type { UpstreamResponse } from './upstream.js'

/**
 * The engine's body-less GET and HEAD sends on the proxy's kind of keep-alive connections
 * (OriginPool) instead of undici: about 10 µs less CPU a request (`npx tsx
 * scripts/upstream-clients.ts`), and a paid call makes two. Upstream.send chooses; what this
 * path does not write as it is goes to undici, which refuses or frames it itself.
 */

/** Headers that frame or route the request (the hop-by-hop ones, Host, Content-Length, Expect): set here (Host) or not at all on this path. */
const FRAMING: ReadonlySet<string> = new Set([...HOP_BY_HOP, 'host', 'content-length', 'expect'])

/**
 * The request head for `method path` with Host `authority` and `headers` as given, or null
 * when a header is not a plain field this path may write (a name that is not a token, a value
 * with a control character, or one of the framing headers): the caller sends it on undici.
 */
export function pooledHead(method: string, path: string, authority: string, headers: Readonly<Record<string, string>>): string | null {
  let out = `${method} ${path} HTTP/1.1\r\nhost: ${authority}\r\n`
  for (const k in headers) {
    const v = headers[k]!
    if (!TOKEN.test(k) || BAD_FIELD_VALUE_CHAR.test(v) || FRAMING.has(k.toLowerCase())) return null
    out += `${k}: ${v}\r\n`
  }
  return `${out}\r\n`
}

/** One send's answer as an UpstreamResponse, as undici's Handler gives it (upstream.ts). A class: it runs twice a paid call. */
class PooledSink implements ExchangeSink {
  exchange: Exchange | null = null
  private body: ExchangeBody | null = null

  constructor(
    private readonly resolve: (r: UpstreamResponse) => void,
    private readonly reject: (e: Error) => void,
  ) {}

  head(head: ResponseHead | null, framing: Framing | null): boolean {
    // The exchange has stopped: an answer this path cannot read (undici would refuse it too).
    if (!head || !framing) {
      this.reject(new UpstreamError('network', 'upstream request failed: the target answered with a response head or body framing that cannot be read'))
      return false
    }
    this.body = new ExchangeBody(this.exchange!)
    this.resolve({ status: head.status, headers: head.map, body: this.body })
    return true // the body without its chunked framing
  }

  data(chunk: Buffer, transient: boolean): boolean {
    return this.body!.push(transient ? Buffer.from(chunk) : chunk)
  }

  end(): void {
    this.body!.complete = true
    this.body!.push(null)
  }

  flush(): void {}

  /** Never resent here, even from a stale connection: a paid send's fate is the engine's to settle (deliver.ts). */
  error(e: UpstreamError | PaygateError): void {
    if (this.body) this.body.destroy(e)
    else this.reject(e)
  }
}

/** Send `head` to `origin` on `pool`; resolves at the answer's head, its body streaming as undici's does. */
export function pooledSend(pool: OriginPool, origin: Origin, head: string, method: string): Promise<UpstreamResponse> {
  return new Promise((resolve, reject) => {
    const sink = new PooledSink(resolve, reject)
    try {
      sink.exchange = pool.request(origin, head, method, sink)
    } catch (e) {
      reject(e) // the egress guard refused an IP literal at once
    }
  })
}
