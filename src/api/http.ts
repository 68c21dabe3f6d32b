import type { IncomingMessage, ServerResponse } from 'node:http'
import { PaygateError, invalid } from '../errors/index.js'
import { collectUpTo, discard } from '../util/collect.js'
import { jsonDepth } from '../util/json-depth.js'
import type { Reply } from './router.js'

/** Nesting of arrays and objects allowed in an API request body; deeper is 400 `invalid_request`. */
export const MAX_JSON_DEPTH = 64
/** A body over the size limit is still read and dropped up to this many times the limit, so the 413 reaches a client still sending. */
const DRAIN_FACTOR = 4

/**
 * Read and parse a JSON body; empty means `{}`. Enforces the size limit, the nesting depth
 * (walkers such as canonical key sorting recurse, and deep enough JSON overflows the stack)
 * and the content type.
 */
export async function readJsonBody(req: IncomingMessage, maxBytes: number, maxDepth = MAX_JSON_DEPTH): Promise<unknown> {
  const declared = Number(req.headers['content-length'] ?? 0)
  const tooLarge = (): PaygateError => new PaygateError('payload_too_large', `request body exceeds ${maxBytes} bytes`)
  if (declared > maxBytes) {
    if (declared <= maxBytes * DRAIN_FACTOR) await discard(req, declared)
    throw tooLarge()
  }
  const { head, rest } = await collectUpTo(req, maxBytes, declared || undefined)
  if (rest) {
    await discard(rest, maxBytes * DRAIN_FACTOR - head.length)
    throw tooLarge()
  }
  if (head.length === 0) return {}
  const type = String(req.headers['content-type'] ?? '')
    .split(';')[0]!
    .trim()
    .toLowerCase()
  if (type !== 'application/json' && !type.endsWith('+json')) {
    throw invalid('content-type', 'the body must be JSON sent with Content-Type: application/json')
  }
  const text = head.toString('utf8')
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch {
    throw invalid('body', 'the body is not valid JSON')
  }
  if (jsonDepth(text) > maxDepth) throw invalid('body', `the body nests arrays and objects deeper than ${maxDepth} levels`)
  return parsed
}

export function sendReply(res: ServerResponse, reply: Reply): void {
  const headers: Record<string, string | number> = { 'cache-control': 'no-store', ...reply.headers }
  if (reply.raw) {
    headers['content-type'] = reply.raw.contentType
    res.writeHead(reply.status, headers)
    res.end(reply.raw.data)
    return
  }
  if (reply.body === undefined) {
    res.writeHead(reply.status, headers)
    res.end()
    return
  }
  const data = JSON.stringify(reply.body)
  headers['content-type'] = 'application/json; charset=utf-8'
  headers['content-length'] = Buffer.byteLength(data)
  res.writeHead(reply.status, headers)
  // Head and body leave in one write() syscall: write() corks the socket with both in one
  // chunk, and uncorking at once sends that chunk alone. end(data), or end() with anything
  // still corked, adds an empty final chunk and goes out as a writev, which costs more CPU.
  res.write(data)
  res.socket?.uncork()
  res.end()
}

/** Parse an optional integer query parameter within bounds. */
export function intParam(url: URL, name: string, dflt: number, min: number, max: number): number {
  const v = url.searchParams.get(name)
  if (v === null || v === '') return dflt
  if (!/^\d+$/.test(v) || Number(v) < min || Number(v) > max) throw invalid(name, `${name} must be an integer from ${min} to ${max}`)
  return Number(v)
}

/** Reject body fields a route does not know. */
export function onlyFields(body: unknown, allowed: readonly string[]): Record<string, unknown> {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw invalid('body', 'the body must be a JSON object')
  for (const k of Object.keys(body)) if (!allowed.includes(k)) throw invalid(k, `unknown field ${k}`)
  return body as Record<string, unknown>
}
