import { BaseError, HttpRequestError, http, SocketClosedError, TimeoutError, type Transport, WebSocketRequestError, webSocket } from 'viem'
import { PaygateError } from '../errors/index.js'
import { DevnetUnavailableError } from './devnet/index.js'

/** Talking to the chain's node: its transport, and telling a node that did not answer from one that said no. */

/** The node did not answer (unreachable, timed out, socket closed, an HTTP error, a dead or stalled embedded anvil). */
export const isUnanswered = (e: unknown): boolean =>
  e instanceof DevnetUnavailableError ||
  (e instanceof BaseError &&
    !!e.walk((x) => x instanceof HttpRequestError || x instanceof TimeoutError || x instanceof WebSocketRequestError || x instanceof SocketClosedError || x instanceof DevnetUnavailableError))

/**
 * A read the node did not answer (unreachable, timed out, socket closed, an HTTP error such
 * as a provider refusing its key) is 503 `unavailable`, the cause kept for the log; any
 * other error (a revert, a bad answer) is thrown as it is.
 */
export function unanswered(e: unknown): never {
  if (isUnanswered(e)) throw new PaygateError('unavailable', 'the chain is not answering; retry later', { headers: { 'retry-after': '2' }, cause: e })
  throw e
}

export function transportFor(url: string): Transport {
  return url.startsWith('ws') ? webSocket(url) : http(url, { batch: false, retryCount: 2 })
}
