import { readFileSync } from 'node:fs'
import { rootCertificates } from 'node:tls'
import type { Readable } from 'node:stream'
import { Agent, request } from 'undici'
import { PaygateError } from '../errors/index.js'

/** undici lives here: pooled keep-alive upstream connections, no redirect following. */
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

export class UpstreamError extends Error {
  constructor(
    readonly kind: 'timeout' | 'network',
    message: string,
  ) {
    super(message)
    this.name = 'UpstreamError'
  }
}

export class Upstream {
  readonly dispatcher: Agent

  /** Upstream TLS trusts the system roots plus the PEM bundle in `caFile`. */
  constructor(caFile: string | null, private readonly defaultTimeoutMs = 30_000) {
    let ca: string[] | undefined
    if (caFile) {
      let extra: string
      try {
        extra = readFileSync(caFile, 'utf8')
      } catch (e) {
        throw new PaygateError('invalid_config', `upstream.caFile ${caFile} cannot be read: ${(e as Error).message}`)
      }
      ca = [...rootCertificates, extra]
    }
    this.dispatcher = new Agent({ keepAliveTimeout: 30_000, connections: 256, ...(ca ? { connect: { ca } } : {}) })
  }

  async send(req: UpstreamRequest): Promise<UpstreamResponse> {
    const timeout = req.timeoutMs ?? this.defaultTimeoutMs
    try {
      const res = await request(req.url, {
        method: req.method as 'GET',
        headers: req.headers,
        body: req.body ?? null,
        dispatcher: this.dispatcher,
        headersTimeout: timeout,
        bodyTimeout: timeout,
      })
      return { status: res.statusCode, headers: res.headers as Record<string, string | string[] | undefined>, body: res.body }
    } catch (e) {
      const code = (e as { code?: string }).code ?? ''
      if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT' || code === 'UND_ERR_CONNECT_TIMEOUT') {
        throw new UpstreamError('timeout', `upstream timed out (${code})`)
      }
      throw new UpstreamError('network', `upstream request failed: ${(e as Error).message}`)
    }
  }

  async close(): Promise<void> {
    await this.dispatcher.close()
  }
}

/** Read a body into memory up to `max` bytes; more is an error (402 bodies are small). */
export async function readBody(body: Readable, max: number): Promise<Buffer> {
  const chunks: Buffer[] = []
  let size = 0
  for await (const c of body as AsyncIterable<Buffer>) {
    size += c.length
    if (size > max) {
      body.destroy()
      throw new PaygateError('payment_protocol_error', `the 402 answer body exceeds ${max} bytes`)
    }
    chunks.push(c)
  }
  return Buffer.concat(chunks)
}
