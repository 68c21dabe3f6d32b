import { BaseError, HttpRequestError, http, SocketClosedError, TimeoutError, type Transport, WebSocketRequestError, webSocket } from 'viem'
import { PaygateError } from '../errors/index.js'
import { channels } from '../events/channels.js'
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

/** `t` publishing each call's method, duration and failure on `paygate:chain:rpc` (only while someone listens). */
export function instrumented(t: Transport): Transport {
  return ((params: Parameters<Transport>[0]) => {
    const inner = t(params)
    const request = (async (args: { method: string; params?: unknown }, options?: unknown) => {
      if (!channels.chainRpc.hasSubscribers) return inner.request(args as never, options as never)
      const started = process.hrtime.bigint()
      const done = (error: boolean): void => channels.chainRpc.publish({ method: args.method, durationMs: Number(process.hrtime.bigint() - started) / 1e6, error })
      try {
        const r = await inner.request(args as never, options as never)
        done(false)
        return r
      } catch (e) {
        done(true)
        throw e
      }
    }) as typeof inner.request
    return { ...inner, request }
  }) as Transport
}
