/**
 * One error type for the whole service. `code` is the stable machine code the API
 * answers with (the spec's `error` values plus a few of our own); `status` is the HTTP
 * status it maps to; `extra` carries the code-specific fields (`reason`, `field`, ...).
 */
export const ERROR_STATUS = {
  invalid_request: 400,
  unauthorized: 401,
  policy_violation: 402,
  insufficient_funds: 402,
  budget_exceeded: 402,
  no_payable_offer: 402,
  forbidden: 403,
  egress_denied: 403,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  idempotency_conflict: 409,
  payload_too_large: 413,
  rate_limited: 429,
  internal_error: 500,
  invalid_config: 500,
  payment_protocol_error: 502,
  payment_failed: 502,
  upstream_unreachable: 502,
  /** `POST /v1/agents/invoke`: the sub-agent answered 4xx/5xx or could not be reached (504 when it timed out); money may have moved. */
  sub_agent_failed: 502,
  /** A paid answer whose body broke off (or was lost to a restart): the payment stands. */
  upstream_body_lost: 502,
  /** A paid answer too large to keep for replays (or for `POST /v1/pay` to return). */
  upstream_body_too_large: 502,
  /** The target's answer to a paid retry was lost after the payment was sent. */
  upstream_answer_lost: 502,
  /** Only as `X-Paygate-Error` on a target's 402 left unpaid: the request body was too large to resend. */
  request_body_too_large: 402,
  unavailable: 503,
} as const

export type ErrorCode = keyof typeof ERROR_STATUS

/** What an error carries besides its code and detail. */
export interface PaygateErrorOptions {
  /** Code-specific fields of the answer's body (`reason`, `field`, ...). */
  extra?: Record<string, unknown>
  /** Response headers that belong with this error (e.g. Retry-After, Allow). */
  headers?: Record<string, string>
  /** What went wrong underneath, for the log only (never in the answer). */
  cause?: unknown
}

export class PaygateError extends Error {
  readonly code: ErrorCode
  readonly status: number
  readonly detail: string
  readonly extra: Record<string, unknown>
  /** Response headers that belong with this error (e.g. Retry-After, Allow). */
  readonly headers: Record<string, string>

  constructor(code: ErrorCode, detail: string, options: PaygateErrorOptions = {}) {
    const { extra = {}, headers = {}, cause } = options
    super(`${code}: ${detail}`, cause === undefined ? undefined : { cause })
    this.name = 'PaygateError'
    this.code = code
    this.status = ERROR_STATUS[code]
    this.detail = detail
    this.extra = extra
    this.headers = headers
  }

  /** The spec's error body: `{error, detail, ...extra}`. */
  toBody(): Record<string, unknown> {
    return { error: this.code, detail: this.detail, ...this.extra }
  }
}

/** `invalid_request` answered 408: a request did not arrive in full within its deadline; the connection closes. */
export class RequestTimeoutError extends PaygateError {
  override readonly status = 408

  constructor(detail = 'the request was not received in time') {
    super('invalid_request', detail, { headers: { connection: 'close' } })
  }
}

export const isPaygateError = (e: unknown): e is PaygateError => e instanceof PaygateError

export const invalid = (field: string, detail: string): PaygateError => new PaygateError('invalid_request', detail, { extra: { field } })

export const notFound = (what: string): PaygateError => new PaygateError('not_found', `${what} does not exist`)

const isErrorCode = (c: string): c is ErrorCode => Object.hasOwn(ERROR_STATUS, c)

/** An error rebuilt from a code read back from storage; a code no longer known becomes `internal_error`. */
export function storedError(code: string, detail: string, extra: Record<string, unknown> = {}): PaygateError {
  return isErrorCode(code) ? new PaygateError(code, detail, { extra }) : toPaygateError(undefined)
}

/** Wrap anything thrown into a PaygateError without leaking internals to the caller. */
export function toPaygateError(e: unknown): PaygateError {
  if (isPaygateError(e)) return e
  return new PaygateError('internal_error', 'internal error; safe to retry with backoff')
}
