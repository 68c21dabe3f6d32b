import { PaygateError } from '../errors/index.js'
import { isEgressDenied } from '../net/egress.js'

/** A transport failure of either upstream client (undici or the proxy's own connections). */
export class UpstreamError extends Error {
  constructor(
    readonly kind: 'timeout' | 'network',
    message: string,
  ) {
    super(message)
    this.name = 'UpstreamError'
  }
}

const TIMEOUTS = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT'])

/** A connection's or undici's error as an UpstreamError; a refusal of the egress guard stays what it is (403 egress_denied, nothing was sent). */
export function upstreamError(e: Error): UpstreamError | PaygateError {
  if (isEgressDenied(e)) return e
  const code = (e as { code?: string }).code ?? ''
  return TIMEOUTS.has(code) ? new UpstreamError('timeout', `upstream timed out (${code})`) : new UpstreamError('network', `upstream request failed: ${e.message}`)
}

/** The agent's answer when the target could not be reached (502 `upstream_unreachable`). */
export const unreachableError = (e: Error): PaygateError => new PaygateError('upstream_unreachable', `the target could not be reached: ${e.message}`, { cause: e })

/** An unpaid send's failure as the agent's 502 (anything but a transport failure, an egress refusal too, is thrown as it is). */
export function unreachable(e: unknown): never {
  throw e instanceof UpstreamError ? unreachableError(e) : e
}
