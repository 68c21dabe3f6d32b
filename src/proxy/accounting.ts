import type { OutgoingHttpHeaders } from 'node:http'
import type { PayOutcome } from '../engine/engine.js'
import { type PaygateError, toPaygateError } from '../errors/index.js'
import { channels } from '../events/channels.js'
import { infoLine, type Logger } from '../log/index.js'
import { formatUnits } from '../util/money.js'
import type { ProxyCounters } from './context.js'
import { forwardResponseHeaders } from './headers.js'

/** What one proxied request came to, filled in as it is served. */
export interface Accounted {
  status: number
  paid: bigint | null
  error: string | undefined
}

/**
 * Every proxied request, on either path, is counted, answered with Paygate's error if it
 * fails, and reported once: the access line and the `paygate:proxy:request` channel.
 */
export class RequestAccounting {
  /** The line per request: its fields are fixed and secret-free. */
  private readonly access: ReturnType<typeof infoLine>

  constructor(
    private readonly log: Logger,
    private readonly accessLog: boolean | undefined,
    private readonly counters: ProxyCounters,
  ) {
    this.access = infoLine(log, 'proxy request')
  }

  async run(agentId: string, method: string, host: string, serve: (a: Accounted) => Promise<void>, fail: (e: PaygateError) => Promise<void>): Promise<void> {
    const started = performance.now()
    this.counters.requests++
    const a: Accounted = { status: 0, paid: null, error: undefined }
    try {
      await serve(a)
    } catch (e) {
      const err = toPaygateError(e)
      if (err.code === 'internal_error') this.log.error({ err: e, agentId }, 'proxy request failed')
      a.error = err.code
      a.status = err.status
      await fail(err)
    } finally {
      this.report(agentId, method, host, a, performance.now() - started)
    }
  }

  /** A request refused 407 (no agent: credentials missing or wrong): a failure, so always its line. */
  denied(method: string | undefined, host: string | undefined): void {
    this.access({ method, host, status: 407, error: 'unauthorized' })
  }

  /** With `accessLog: false`, the line only for payments and failures (a paid or failed request is always logged). */
  private report(agentId: string, method: string, host: string, a: Accounted, ms: number): void {
    if (channels.proxyRequest.hasSubscribers) channels.proxyRequest.publish({ agentId, method, status: a.status, paid: a.paid, error: a.error, durationMs: ms })
    if (this.accessLog === false && a.paid === null && a.error === undefined) return
    this.access({ agentId, method, host, status: a.status, paidUsdc: a.paid === null ? undefined : formatUnits(a.paid), error: a.error, ms: Math.round(ms * 100) / 100 })
  }
}

/** The agent's view of an engine outcome: the target's answer plus Paygate's headers (and `a` filled in). */
export function answerOf(out: PayOutcome, a: Accounted): OutgoingHttpHeaders {
  const h = forwardResponseHeaders(out.response.headers)
  a.status = out.response.status
  if (out.payment) {
    h['x-paygate-tx'] = out.payment.txHash
    h['x-paygate-amount'] = formatUnits(out.payment.amount)
    h['x-paygate-protocol'] = out.payment.protocol
    a.paid = out.payment.amount
  }
  if (out.session) h['x-paygate-session'] = 'reused'
  if (out.unpaid) h['x-paygate-error'] = a.error = out.unpaid.code
  return h
}
