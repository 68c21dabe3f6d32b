import type { ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { unreachableError } from '../upstream/errors.js'
import { errorBytes, errorRaw } from '../errors/http.js'
import { PaygateError } from '../errors/index.js'
import { isEgressDenied } from '../net/egress.js'
import type { FastConn } from './fast.js'
import { writeAnswer } from './relay.js'

/** Missing or wrong proxy credentials: `unauthorized` (as on the API), answered 407 with the challenge. */
class ProxyAuthError extends PaygateError {
  override readonly status = 407

  constructor() {
    super('unauthorized', 'proxy credentials missing or wrong: use http://<agentId>:<agentKey>@proxy', { headers: { 'proxy-authenticate': 'Basic realm="paygate"' } })
  }
}

export const DENIED: PaygateError = new ProxyAuthError()

/** Where an answer Paygate composes goes: a fast-path connection, a Node response, or a socket that left HTTP. */
export type Sink = { conn: FastConn; method: string } | ServerResponse | Socket

const isResponse = (s: Sink): s is ServerResponse => 'writeHead' in s

/** Answer `e` on any sink; `close`: the connection ends after it (a socket always does). */
export function sendError(to: Sink, e: PaygateError, close = false): Promise<void> {
  if ('conn' in to) {
    if (close) to.conn.closeAfter = true
    const { status, headers, body } = errorRaw(e)
    return writeAnswer(to.conn, to.method, status, headers, body)
  }
  if (isResponse(to)) {
    if (to.headersSent) to.destroy()
    else {
      const { status, headers, body } = errorRaw(e)
      to.writeHead(status, close ? { ...headers, connection: 'close' } : headers)
      to.end(body)
    }
    return Promise.resolve()
  }
  to.end(errorBytes(e))
  return Promise.resolve()
}

/** A request-target the proxy does not serve (not absolute-form outside a tunnel). */
export const notAbsolute = (example: string): PaygateError =>
  new PaygateError('invalid_request', `this is a forward proxy: send absolute-form requests (${example}) or CONNECT`, { extra: { field: 'request-target' } })

/** A target that could not be reached, as the agent is told: the egress guard's refusal (403) as it is, anything else 502. */
export const cannotReach = (e: Error): PaygateError => (isEgressDenied(e) ? e : unreachableError(e))
