import { PaygateError } from '../errors/index.js'
import { UpstreamError, upstreamError } from '../upstream/errors.js'
import { jsonDepth } from '../util/json-depth.js'

/** Deepest JSON a sub-agent's answer may nest to be returned parsed (deeper: as text). */
export const MAX_OUTPUT_DEPTH = 512

/**
 * The invocation's `output`: the sub-agent's `output` field when its body is a JSON object that
 * has one, else the whole JSON body, else the body as text.
 */
export function outputOf(body: Buffer): unknown {
  const text = body.toString('utf8')
  if (!/^\s*[[{"\d tfn-]/.test(text) || jsonDepth(text) > MAX_OUTPUT_DEPTH) return text
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch {
    return text
  }
  if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed) && Object.hasOwn(parsed, 'output')) return (parsed as Record<string, unknown>).output
  return parsed
}

/** `sub_agent_failed` answered 504: the sub-agent did not answer within `invoke.timeoutMs`. */
export class SubAgentTimeout extends PaygateError {
  override readonly status = 504
}

/** Errors that say the sub-agent failed (rather than a refusal of Paygate's own): how they answer. */
const FAILED_CODES = new Set(['upstream_unreachable', 'payment_failed', 'payment_protocol_error', 'upstream_answer_lost', 'upstream_body_lost', 'upstream_body_too_large'])

const timedOut = (e: unknown): boolean => (e instanceof UpstreamError && e.kind === 'timeout') || (e instanceof PaygateError && e.cause instanceof UpstreamError && e.cause.kind === 'timeout')

/**
 * A failure of the call to the sub-agent as the invoke answer: 502 `sub_agent_failed` (504 on a
 * timeout) when the sub-agent failed or could not be reached, else the error as it is (a policy
 * or cap refusal, egress denied). `extra` (what was spent) goes on either, since money may have moved.
 */
export function invokeFailure(e: unknown, extra: Record<string, unknown>): PaygateError {
  if (timedOut(e)) return new SubAgentTimeout('sub_agent_failed', `the sub-agent did not answer in time: ${(e as Error).message}`, { extra: { upstreamStatus: null, ...extra }, cause: e })
  if (e instanceof UpstreamError) return new PaygateError('sub_agent_failed', `the sub-agent could not be reached: ${e.message}`, { extra: { upstreamStatus: null, ...extra }, cause: e })
  if (e instanceof PaygateError && FAILED_CODES.has(e.code)) {
    return new PaygateError('sub_agent_failed', `the sub-agent failed: ${e.detail}`, { extra: { upstreamStatus: null, ...e.extra, reason: e.code, ...extra }, cause: e })
  }
  if (e instanceof PaygateError) return new PaygateError(e.code, e.detail, { extra: { ...e.extra, ...extra }, headers: e.headers, cause: e })
  return new PaygateError('internal_error', 'internal error; safe to retry with backoff', { extra, cause: e })
}

/** `e` with `extra` added to its answer, same code and status. */
export function withExtra(e: PaygateError, extra: Record<string, unknown>): PaygateError {
  const opts = { extra: { ...e.extra, ...extra }, headers: e.headers, cause: e.cause }
  return e instanceof SubAgentTimeout ? new SubAgentTimeout(e.code, e.detail, opts) : new PaygateError(e.code, e.detail, opts)
}

/** The sub-agent answered with an error status (or a 402 Paygate could not pay). */
export const failedAnswer = (status: number, extra: Record<string, unknown>): PaygateError =>
  new PaygateError('sub_agent_failed', `the sub-agent answered ${status}`, { extra: { upstreamStatus: status, ...extra } })

/**
 * A failure while reading the body of the sub-agent's answer (it broke off, the socket closed,
 * a chunk never came): 502 `sub_agent_failed` with the status it had sent, since the failure is
 * the sub-agent's, not Paygate's. A timeout stays one (504); our own refusals (too large) pass as they are.
 */
export function brokenAnswer(e: unknown, status: number): unknown {
  if (e instanceof PaygateError) return e
  const err = e instanceof Error ? e : new Error(String(e))
  const mapped = err instanceof UpstreamError ? err : upstreamError(err)
  if (mapped instanceof UpstreamError && mapped.kind === 'timeout') return mapped
  return new PaygateError('sub_agent_failed', `the sub-agent's answer broke off: ${err.message}`, { extra: { upstreamStatus: status }, cause: e })
}
