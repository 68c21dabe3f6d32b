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

/** OpenSSL's codes for a certificate chain that does not lead to a trusted root: a private CA the system does not know. */
const UNTRUSTED = new Set(['UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'UNABLE_TO_GET_ISSUER_CERT', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'SELF_SIGNED_CERT_IN_CHAIN', 'DEPTH_ZERO_SELF_SIGNED_CERT'])

/** The hint for an untrusted target certificate: the key that adds its CA. */
export const TRUST_HINT = "; if the target's certificate is from a private CA, add that CA's PEM file as upstream.caFile (PAYGATE_UPSTREAM_CA_FILE)"

/** An error's message, with the upstream.caFile hint when its code (or its cause's) says the certificate is not trusted. */
export function messageOf(e: Error): string {
  const codes = [(e as { code?: string }).code, (e as { cause?: { code?: string } }).cause?.code]
  return codes.some((c) => c !== undefined && UNTRUSTED.has(c)) && !e.message.includes('upstream.caFile') ? e.message + TRUST_HINT : e.message
}

/** A connection's or undici's error as an UpstreamError; a refusal of the egress guard stays what it is (403 egress_denied, nothing was sent). */
export function upstreamError(e: Error): UpstreamError | PaygateError {
  if (isEgressDenied(e)) return e
  const code = (e as { code?: string }).code ?? ''
  return TIMEOUTS.has(code) ? new UpstreamError('timeout', `upstream timed out (${code})`) : new UpstreamError('network', `upstream request failed: ${messageOf(e)}`)
}

/** The agent's answer when the target could not be reached (502 `upstream_unreachable`). */
export const unreachableError = (e: Error): PaygateError => new PaygateError('upstream_unreachable', `the target could not be reached: ${messageOf(e)}`, { cause: e })

/** An unpaid send's failure as the agent's 502 (anything but a transport failure, an egress refusal too, is thrown as it is). */
export function unreachable(e: unknown): never {
  throw e instanceof UpstreamError ? unreachableError(e) : e
}
