import type { Readable } from 'node:stream'
import type { PaymentEngine } from '../../engine/engine.js'
import { canonicalJson, nothingSigned, requestDigest, type Idempotency } from '../../engine/idempotency.js'
import { PaygateError, invalid } from '../../errors/index.js'
import { decodeContent } from '../../upstream/decode.js'
import { BAD_FIELD_VALUE_CHAR, TOKEN } from '../../upstream/http1.js'
import { collect } from '../../util/collect.js'
import { jsonDepth } from '../../util/json-depth.js'
import { remembered } from '../../util/lru.js'
import { usdc } from '../../util/money.js'
import { validateAgentId } from '../../agents/registry.js'
import { onlyFields } from '../http.js'
import { requireAgentAccess, type Reply, type Route } from '../router.js'

const METHODS = new Set(['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'])
/**
 * Hop-by-hop and transport headers a caller may not set for the target; and Accept-Encoding:
 * Paygate reads the answer itself to return it as `data`.
 */
const STRIPPED = new Set(['host', 'connection', 'keep-alive', 'proxy-authorization', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'content-length', 'accept-encoding'])
/** Headers undici refuses to send (it throws before connecting); those it also refuses and that are hop-by-hop are STRIPPED. */
const REFUSED = new Set(['expect'])
const MAX_DATA_BYTES = 10 * 1024 * 1024
/**
 * How deeply the JSON `body` sent on to the target may nest (the request around it adds one
 * level), and how deeply a target's JSON answer may nest to be returned parsed as `data`
 * (deeper: as text). Serializing and key sorting recurse; this keeps them far from the stack's end.
 */
export const MAX_PAY_BODY_DEPTH = 512

interface PayBody {
  agentId: string
  url: string
  method: string
  headers: Record<string, string>
  body: Buffer | null
  /** The JSON `body` with its keys sorted: the same body in another key order is the same request. */
  canonicalBody: Buffer | null
  idempotencyKey?: string
  parentTxHash?: string
  /** The `X-Paygate-Invocation` header of the request: the payment joins that invocation's tree. */
  invocation?: string
}

interface Endpoint {
  href: string
  protocol: string
}
/** An endpoint's parse (agents pay the same few: one parse each). */
const endpointUrl = remembered((s: string): Endpoint => {
  const u = new URL(s)
  return Object.freeze({ href: u.href, protocol: u.protocol })
})

function parsePay(raw: unknown): PayBody {
  const b = onlyFields(raw, ['agentId', 'endpoint', 'method', 'headers', 'body', 'idempotencyKey', 'parentTxHash'])
  if (b.agentId === undefined) throw invalid('agentId', 'agentId is required')
  const agentId = validateAgentId(b.agentId)
  if (typeof b.endpoint !== 'string') throw invalid('endpoint', 'endpoint (an http or https URL) is required')
  let url: Endpoint
  try {
    url = endpointUrl(b.endpoint)
  } catch {
    throw invalid('endpoint', 'endpoint must be an absolute http or https URL')
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw invalid('endpoint', 'endpoint must be an http or https URL')
  const method = b.method === undefined ? 'GET' : typeof b.method === 'string' ? b.method.toUpperCase() : ''
  if (!METHODS.has(method)) throw invalid('method', `method must be one of ${[...METHODS].join(', ')}`)
  const headers: Record<string, string> = {}
  if (b.headers !== undefined) {
    if (typeof b.headers !== 'object' || b.headers === null || Array.isArray(b.headers)) throw invalid('headers', 'headers must be an object of strings')
    for (const [k, v] of Object.entries(b.headers)) {
      if (typeof v !== 'string' || !TOKEN.test(k)) throw invalid(`headers.${k}`, `header ${k} must be a valid name with a string value`)
      const bad = BAD_FIELD_VALUE_CHAR.exec(v)
      if (bad) {
        const char = `U+${bad[0].codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`
        throw invalid(`headers.${k}`, `header ${k} has ${char} at index ${bad.index}: a value may hold visible ASCII, space, tab and Latin-1 characters (U+0080 to U+00FF) only`)
      }
      const name = k.toLowerCase()
      if (name.startsWith('x-paygate-'))
        throw invalid(`headers.${k}`, `header ${k} cannot be sent: X-Paygate-* headers are Paygate's own controls (send X-Paygate-Invocation on the POST /v1/pay request itself)`)
      if (REFUSED.has(name)) throw invalid(`headers.${k}`, `header ${k} cannot be sent: Paygate sends the request body at once and handles the target's 1xx answers itself`)
      if (!STRIPPED.has(name)) headers[name] = v
    }
  }
  let body: Buffer | null = null
  let canonicalBody: Buffer | null = null
  if (b.body !== undefined && b.body !== null) {
    body = Buffer.from(JSON.stringify(b.body))
    canonicalBody = Buffer.from(canonicalJson(b.body))
    headers['content-type'] ??= 'application/json'
  }
  if (b.idempotencyKey !== undefined && (typeof b.idempotencyKey !== 'string' || b.idempotencyKey.length < 1 || b.idempotencyKey.length > 255)) {
    throw invalid('idempotencyKey', 'idempotencyKey must be a string of 1 to 255 characters')
  }
  if (b.parentTxHash !== undefined && (typeof b.parentTxHash !== 'string' || !/^0x[0-9a-fA-F]{64}$/.test(b.parentTxHash))) {
    throw invalid('parentTxHash', 'parentTxHash must be a 0x-prefixed 32-byte transaction hash')
  }
  return {
    agentId,
    url: url.href,
    method,
    headers,
    body,
    canonicalBody,
    ...(b.idempotencyKey !== undefined ? { idempotencyKey: b.idempotencyKey as string } : {}),
    ...(b.parentTxHash !== undefined ? { parentTxHash: b.parentTxHash as string } : {}),
  }
}

function parseData(body: Buffer, contentType: string | string[] | undefined): unknown {
  const text = body.toString('utf8')
  if ((/json/i.test(String(contentType ?? '')) || /^\s*[[{]/.test(text)) && jsonDepth(text) <= MAX_PAY_BODY_DEPTH) {
    try {
      return JSON.parse(text)
    } catch {
      return text
    }
  }
  return text
}

/** Why `data` is null in an answer whose target body could not be read. */
type DataError = { error: 'upstream_body_too_large' | 'upstream_body_lost'; detail: string }

/** The target's body, up to MAX_DATA_BYTES, or why it cannot be had (the read error kept in `detail`). */
async function readData(body: Readable): Promise<{ data: Buffer } | DataError> {
  let tooLarge = false
  try {
    return {
      data: await collect(body, MAX_DATA_BYTES, () => {
        tooLarge = true
        return new Error('too large')
      }),
    }
  } catch (e) {
    if (tooLarge) return { error: 'upstream_body_too_large', detail: `the target's answer exceeds ${MAX_DATA_BYTES} bytes, the most POST /v1/pay returns` }
    return { error: 'upstream_body_lost', detail: `the target's answer broke off before its end: ${(e as Error).message}` }
  }
}

/** The body with its content coding undone (a target may use one unasked), up to MAX_DATA_BYTES decoded; an unknown coding is left as it is. */
function decoded(read: { data: Buffer } | DataError, coding: string | string[] | undefined): { data: Buffer } | DataError {
  if ('error' in read) return read
  const out = decodeContent(read.data, coding, MAX_DATA_BYTES)
  if ('data' in out) return out
  return out.failure === 'too_large'
    ? { error: 'upstream_body_too_large', detail: `the target's answer exceeds ${MAX_DATA_BYTES} bytes once decoded, the most POST /v1/pay returns` }
    : { error: 'upstream_body_lost', detail: `the target's ${String(coding)} answer cannot be decoded: ${out.message}` }
}

/** The merchant's settlement as a pay answer shows it. */
const settlementView = (s: { success: boolean; transaction: string | null; network: string | null } | null | undefined) =>
  s ? { success: s.success, transaction: s.transaction, network: s.network } : null

/** One pay call through the engine, answered as `POST /v1/pay` shows it. */
async function runPay(engine: PaymentEngine, p: PayBody): Promise<Reply> {
  const out = await engine.pay({
    agentId: p.agentId,
    url: p.url,
    method: p.method,
    headers: p.headers,
    body: p.body,
    ...(p.parentTxHash ? { parentTxHash: p.parentTxHash } : {}),
    ...(p.idempotencyKey ? { idempotencyKey: p.idempotencyKey } : {}),
    ...(p.invocation !== undefined ? { invocation: p.invocation } : {}),
  })
  if (out.unpaid) {
    out.response.body.resume()
    throw out.unpaid
  }
  const read = decoded(await readData(out.response.body), out.response.headers['content-encoding'])
  // The engine accounted for this call (paid, served under a session, or sent an authorization
  // it still holds): the answer stands with `data: null` and why, and an idempotent replay
  // returns it, never paying again. A call that was only relayed is an error, free to retry.
  const accounted = out.payment !== null || out.session !== undefined || out.held !== undefined
  if ('error' in read && !accounted) throw new PaygateError('upstream_unreachable', read.detail, { extra: { reason: read.error } })
  const data = 'data' in read ? parseData(read.data, out.response.headers['content-type']) : null
  const pay = out.payment
  return {
    status: 200,
    body: {
      protocol: pay?.protocol ?? out.session?.protocol ?? null,
      amountPaid: usdc(pay?.amount ?? 0n),
      txHash: pay?.txHash ?? null,
      status: out.response.status,
      data,
      ...('error' in read ? { dataError: read } : {}),
      ...(out.session ? { session: 'reused' } : {}),
      ...(pay ? { transactionId: pay.transactionId, rail: pay.rail, settlement: settlementView(pay.settlement) } : {}),
      ...(out.held ? { transactionId: out.held.transactionId } : {}),
    },
  }
}

/** A request under this key was cut off by a crash: a paid one answers without its data (lost with the process). */
async function recoverPay(engine: PaymentEngine, p: PayBody, startedAt: number): Promise<Reply | undefined> {
  const rec = await engine.cutOff(p.agentId, p.idempotencyKey!, startedAt)
  if (!rec) return undefined
  return {
    status: 200,
    body: {
      protocol: rec.protocol,
      amountPaid: usdc(BigInt(rec.amount)),
      txHash: rec.txHash,
      status: rec.upstreamStatus ?? null,
      data: null,
      dataError: { error: 'upstream_body_lost', detail: "Paygate restarted before this request's answer was returned; the payment is recorded" },
      transactionId: rec.id,
      rail: rec.rail ?? 'stablecoin',
      settlement: settlementView(rec.settlement),
    },
  }
}

/** `POST /v1/pay`: the payment engine behind the API, with idempotency keys. */
export function payRoutes(engine: PaymentEngine, idem: Idempotency): Route[] {
  const run = (p: PayBody): Promise<Reply> => runPay(engine, p)
  return [
    {
      method: 'POST',
      path: '/v1/pay',
      access: 'agent',
      maxJsonDepth: 1 + MAX_PAY_BODY_DEPTH,
      async handler(ctx) {
        const p = parsePay(await ctx.body())
        requireAgentAccess(ctx.identity, p.agentId)
        const token = ctx.headers['x-paygate-invocation']
        if (typeof token === 'string') p.invocation = token
        if (!p.idempotencyKey) return run(p)
        // run() raises nothing once a payment is made, so an unreadable 402 is not stored either.
        return idem.run(
          p.agentId,
          p.idempotencyKey,
          requestDigest({ ...p, body: p.canonicalBody, headers: p.invocation !== undefined ? { ...p.headers, 'x-paygate-invocation': p.invocation } : p.headers }),
          () => run(p),
          nothingSigned,
          (startedAt) => recoverPay(engine, p, startedAt),
        )
      },
    },
  ]
}
