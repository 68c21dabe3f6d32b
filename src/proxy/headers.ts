import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http'
import { connectionTokens, HOP_BY_HOP } from '../upstream/http1.js'

/**
 * Request headers for the target: no hop-by-hop fields, no `Host` (the client sets it
 * from the URL), no `X-Paygate-*` (Paygate's own controls), no `Expect` (Node has already
 * answered the agent's `100-continue`, and undici refuses to send one). Multi-valued fields are joined.
 * `acceptPayment`: sent as Accept-Payment unless the agent sent one.
 */
export function forwardRequestHeaders(h: IncomingHttpHeaders, acceptPayment?: string): Record<string, string> {
  const drop = connectionTokens(h.connection)
  const out: Record<string, string> = {}
  // First, so an agent's own Accept-Payment replaces it.
  if (acceptPayment !== undefined) out['accept-payment'] = acceptPayment
  for (const k in h) {
    const v = h[k]
    if (v === undefined || HOP_BY_HOP.has(k) || drop.has(k) || k === 'host' || k === 'expect' || k.startsWith('x-paygate-')) continue
    out[k] = Array.isArray(v) ? v.join(', ') : v
  }
  return out
}

/** Response headers for the agent: no hop-by-hop fields. */
export function forwardResponseHeaders(h: Record<string, string | string[] | undefined>): OutgoingHttpHeaders {
  const drop = connectionTokens(h.connection)
  const out: OutgoingHttpHeaders = {}
  for (const k in h) {
    const v = h[k]
    if (v === undefined || HOP_BY_HOP.has(k) || drop.has(k)) continue
    out[k] = v
  }
  return out
}

export const headerValue = (h: IncomingHttpHeaders, name: string): string | undefined => {
  const v = h[name]
  return Array.isArray(v) ? v[0] : v
}
