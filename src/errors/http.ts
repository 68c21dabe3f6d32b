import { STATUS_CODES } from 'node:http'
import { PaygateError, RequestTimeoutError } from './index.js'

/**
 * The one place a PaygateError becomes an HTTP answer: the API's JSON reply, and the bytes
 * the proxy writes on Node responses and raw sockets. Both carry the same body
 * (`toBody()`); the proxy's also names the code in `X-Paygate-Error` so an agent never
 * mistakes Paygate's answer for a target's.
 */

/** The API's reply: the router serialises the body (and sets its content type). */
export interface ErrorJson {
  status: number
  headers: Record<string, string>
  body: Record<string, unknown>
}

export const errorJson = (e: PaygateError): ErrorJson => ({ status: e.status, headers: e.headers, body: e.toBody() })

/** The proxy's answer: content type and length and `X-Paygate-Error` included. */
export interface ErrorRaw {
  status: number
  headers: Record<string, string | number>
  body: Buffer
}

/** `status` overrides the code's own where the answer has a status of its own (a parser's 431). */
export function errorRaw(e: PaygateError, status = e.status): ErrorRaw {
  const body = Buffer.from(JSON.stringify(e.toBody()))
  return { status, headers: { 'content-type': 'application/json', 'content-length': body.length, 'x-paygate-error': e.code, ...e.headers }, body }
}

/** A whole HTTP/1.1 answer for a socket that left Node's HTTP server (CONNECT, upgrades, parser refusals); the connection closes after it. */
export function errorBytes(e: PaygateError, status = e.status): string {
  const { headers, body } = errorRaw(e, status)
  return closingAnswer(status, headers, body.toString())
}

/** An answer's text with `connection: close` last, for writing on a socket directly. */
export function closingAnswer(status: number, headers: Record<string, string | number>, body: string): string {
  let out = `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\n`
  for (const [k, v] of Object.entries(headers)) out += `${k}: ${String(v)}\r\n`
  return `${out}connection: close\r\n\r\n${body}`
}

/**
 * Where Node's bare answer to a refused request has a status of its own, it is kept: 413 is
 * our `payload_too_large`; 431 and 408 have no code of ours, so their body says
 * `invalid_request`. Anything else the parser refuses is 400 `invalid_request`.
 */
const PARSER_ERRORS: Record<string, { status: number; error: PaygateError }> = {
  HPE_HEADER_OVERFLOW: { status: 431, error: new PaygateError('invalid_request', 'request headers are too large') },
  HPE_CHUNK_EXTENSIONS_OVERFLOW: { status: 413, error: new PaygateError('payload_too_large', 'chunk extensions are too large') },
  ERR_HTTP_REQUEST_TIMEOUT: { status: 408, error: new RequestTimeoutError() },
}

/** The status and error for a request Node's HTTP parser refused (its `clientError`). */
export function parserRefusal(e: NodeJS.ErrnoException & { reason?: string }): { status: number; error: PaygateError } {
  return PARSER_ERRORS[e.code ?? ''] ?? { status: 400, error: new PaygateError('invalid_request', `malformed HTTP request: ${e.reason ?? e.message}`) }
}
