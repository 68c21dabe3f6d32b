import { Readable } from 'node:stream'
import type { PaymentEngine, PayOutcome, PayRequest } from '../engine/engine.js'
import { type Attempt, requestDigest, type Idempotency } from '../engine/idempotency.js'
import { errorRaw } from '../errors/http.js'
import { PaygateError, storedError } from '../errors/index.js'
import type { Logger } from '../log/index.js'
import { collectUpTo, headThen } from '../util/collect.js'

const MAX_IDEMPOTENT_BODY = 8 * 1024 * 1024

/** An answer as kept under an idempotency key. */
type Stored = {
  status: number
  headers: Record<string, string | string[] | undefined>
  body: string
  payment: { txHash: string; amount: string; protocol?: 'x402' | 'mpp'; rail?: string } | null
  session?: boolean
  /** The code of a 402 answered unpaid. */
  unpaid?: string
}

const toOutcome = (s: Stored): PayOutcome => {
  const out: PayOutcome = {
    response: { status: s.status, headers: s.headers, body: Readable.from([Buffer.from(s.body, 'base64')]) },
    payment: s.payment
      ? { protocol: s.payment.protocol ?? 'x402', rail: s.payment.rail ?? 'stablecoin', amount: BigInt(s.payment.amount), txHash: s.payment.txHash, transactionId: '', settlement: null }
      : null,
    ...(s.session ? { session: { protocol: 'mpp' as const } } : {}),
  }
  return s.unpaid ? { ...out, unpaid: storedError(s.unpaid, 'unpaid 402') } : out
}

const paymentOf = (out: PayOutcome): Stored['payment'] =>
  out.payment ? { txHash: out.payment.txHash, amount: out.payment.amount.toString(), protocol: out.payment.protocol, rail: out.payment.rail } : null

/** A paid answer whose body is not kept: the payment, and a 502 error body saying why. */
function withoutBody(payment: NonNullable<Stored['payment']>, status: number | null, code: 'upstream_body_lost' | 'upstream_body_too_large', detail: string): Stored {
  const { headers, body } = errorRaw(new PaygateError(code, detail, { extra: { status, txHash: payment.txHash } }))
  return { status: 502, headers: { ...headers, 'content-length': String(body.length) } as Stored['headers'], body: body.toString('base64'), payment }
}

export interface IdempotentDeps {
  engine: PaymentEngine
  idempotency: Idempotency
  log: Logger
}

/**
 * With X-Paygate-Idempotency-Key: the answer is kept (bounded) and replayed; never a second
 * payment. An answer too large to keep streams through to this call; if it cost nothing it
 * is not stored (a retry simply asks again), and if it was paid the key keeps the payment
 * with a 502 `upstream_body_too_large` in place of the body, so replays see the txHash and
 * never pay again. A paid answer whose body broke off is kept the same way.
 */
export async function idempotent(d: IdempotentDeps, agentId: string, key: string, p: PayRequest): Promise<PayOutcome> {
  // The request is its method, URL and body (and their type): headers an agent's HTTP stack
  // adds per attempt (trace ids, retry counters) do not make a retry another request.
  const contentType = p.headers['content-type']
  const digest = requestDigest({ ...p, headers: contentType === undefined ? {} : { 'content-type': contentType } })
  const recover = async (startedAt: number): Promise<Stored | undefined> => {
    const rec = await d.engine.cutOff(agentId, key, startedAt)
    if (!rec) return undefined
    const payment = { txHash: rec.txHash!, amount: rec.amount, protocol: rec.protocol ?? 'x402', rail: rec.rail ?? 'stablecoin' }
    return withoutBody(payment, rec.upstreamStatus ?? null, 'upstream_body_lost', "Paygate restarted before this request's answer was returned; the payment stands")
  }
  const out = await d.idempotency.attempt<Stored, PayOutcome>(agentId, key, digest, () => payOnce(d, agentId, { ...p, idempotencyKey: key }), undefined, recover)
  return out.live ?? toOutcome((out as { kept: Stored }).kept)
}

/**
 * The first call under a key: pay, and read the answer to keep it. An answer too large to keep
 * streams through to this call: kept without its body when paid, not kept at all when it cost
 * nothing (the next call under the key asks the target again).
 */
async function payOnce(d: IdempotentDeps, agentId: string, p: PayRequest): Promise<Attempt<Stored, PayOutcome>> {
  const out = await d.engine.pay(p)
  let read: { head: Buffer; rest: Readable | null }
  try {
    read = await collectUpTo(out.response.body, MAX_IDEMPOTENT_BODY)
  } catch (e) {
    // Nothing paid: not stored (as any unreachable target), so the same key asks again.
    if (!out.payment) throw new PaygateError('upstream_unreachable', `the target's answer broke off before its end: ${(e as Error).message}`)
    d.log.warn({ err: (e as Error).message, agentId, txHash: out.payment.txHash }, 'a paid answer broke off while it was read')
    return {
      keep: withoutBody(paymentOf(out)!, out.response.status, 'upstream_body_lost', `the target's ${out.response.status} answer to this paid request broke off before its end; the payment stands`),
    }
  }
  if (read.rest) {
    const live = { ...out, response: { ...out.response, body: headThen(read.head, read.rest) } }
    if (!out.payment) return { pass: live }
    const kept = withoutBody(
      paymentOf(out)!,
      out.response.status,
      'upstream_body_too_large',
      `the target's ${out.response.status} answer to this paid request was delivered once, to the first call; its body exceeds the ${MAX_IDEMPOTENT_BODY} bytes kept for replays`,
    )
    return { keep: kept, live }
  }
  return {
    keep: {
      status: out.response.status,
      headers: out.response.headers,
      body: read.head.toString('base64'),
      payment: paymentOf(out),
      ...(out.session ? { session: true } : {}),
      ...(out.unpaid ? { unpaid: out.unpaid.code } : {}),
    },
  }
}
