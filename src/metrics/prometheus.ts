import { subscribe, unsubscribe } from 'node:diagnostics_channel'
import promClient from 'prom-client'
import type { ChannelMessages, ChannelName } from '../events/channels.js'

const { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } = promClient

/**
 * The Prometheus registry (prom-client lives only here): counters and histograms fed by the
 * instrumentation channels, gauges and mirrored counters read from the components when
 * scraped. Names follow the Prometheus conventions (`_total`, `_seconds`, `_usdc`). Labels
 * are bounded sets (outcome, protocol, rail, reason, RPC method) and, only with
 * `metrics.agentLabels`, the agent; never a URL.
 */
export interface PromSources {
  proxy: { counters: { authFailures: number; tunnels: number }; readonly connections: number; leafCache(): { hits: number; misses: number; size: number } }
  egress: { counters: { byReason: Record<string, number> } }
  outbox: { pending(): number }
}

export interface PrometheusOptions {
  agentLabels: boolean
}

/** USDC as Prometheus floats (exposition only: amounts inside stay bigint base units). */
const usdcFloat = (units: bigint): number => Number(units) / 1e6
const seconds = (ms: number): number => ms / 1000

/** Latency buckets in seconds: 1 ms to 60 s. */
const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
/** Payment amounts in USDC: a tenth of a cent to 100. */
const AMOUNT_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 50, 100]

/** What a proxied request came to: paid, Paygate's own error answer, or the target's answer passed on. */
export const proxyOutcome = (m: ChannelMessages['paygate:proxy:request']): string => (m.paid !== null ? 'paid' : m.error !== undefined ? 'error' : 'passed')

export class PrometheusMetrics {
  readonly registry = new Registry()
  private readonly listeners: [string, (m: unknown) => void][] = []
  private readonly withAgent: (labels: Record<string, string>, agentId: string) => Record<string, string>

  constructor(
    private readonly sources: PromSources,
    opts: PrometheusOptions,
  ) {
    const agent = opts.agentLabels ? ['agent'] : []
    this.withAgent = opts.agentLabels ? (labels, agentId) => ({ ...labels, agent: agentId }) : (labels) => labels
    collectDefaultMetrics({ register: this.registry })
    this.proxyMetrics(agent)
    this.paymentMetrics(agent)
    this.ledgerAndChain()
  }

  private proxyMetrics(agent: string[]): void {
    const r = [this.registry]
    const requests = new Counter({
      name: 'paygate_proxy_requests_total',
      help: 'Proxied requests by outcome (paid, error: answered by Paygate, passed: the target answered).',
      labelNames: ['outcome', ...agent],
      registers: r,
    })
    const duration = new Histogram({
      name: 'paygate_upstream_request_duration_seconds',
      help: 'Proxied requests from first byte to answer, by outcome (the upstream call, and the payment when paid).',
      labelNames: ['outcome'],
      buckets: LATENCY_BUCKETS,
      registers: r,
    })
    this.on('paygate:proxy:request', (m) => {
      const outcome = proxyOutcome(m)
      requests.inc(this.withAgent({ outcome }, m.agentId))
      duration.observe({ outcome }, seconds(m.durationMs))
    })
    const s = this.sources
    this.mirror('paygate_proxy_auth_failures_total', 'Proxy requests refused with 407 (missing or wrong agent credentials).', () => [[{}, s.proxy.counters.authFailures]])
    new Gauge({ name: 'paygate_proxy_open_connections', help: 'Connections open on the proxy port.', registers: r, collect: gaugeOf(() => s.proxy.connections) })
    new Gauge({ name: 'paygate_proxy_open_tunnels', help: 'CONNECT tunnels open (intercepted or passed through).', registers: r, collect: gaugeOf(() => s.proxy.counters.tunnels) })
    this.mirror('paygate_leaf_cert_cache_hits_total', 'Leaf certificates served from the cache.', () => [[{}, s.proxy.leafCache().hits]])
    this.mirror('paygate_leaf_cert_cache_misses_total', 'Leaf certificates made (not in the cache).', () => [[{}, s.proxy.leafCache().misses]])
    this.mirror('paygate_egress_denied_total', 'Connections refused by the egress guard, by reason.', () => Object.entries(s.egress.counters.byReason).map(([reason, n]) => [{ reason }, n]), [
      'reason',
    ])
  }

  private paymentMetrics(agent: string[]): void {
    const r = [this.registry]
    const payments = new Counter({
      name: 'paygate_payments_total',
      help: 'Payments by protocol, rail and outcome (paid, failed, held, rejected).',
      labelNames: ['protocol', 'rail', 'outcome', ...agent],
      registers: r,
    })
    const paid = new Counter({ name: 'paygate_paid_usdc_total', help: 'Amount paid in USDC.', labelNames: ['protocol', 'rail', ...agent], registers: r })
    const amounts = new Histogram({ name: 'paygate_payment_amount_usdc', help: 'Amount of each paid payment in USDC.', labelNames: ['protocol'], buckets: AMOUNT_BUCKETS, registers: r })
    const latency = new Histogram({
      name: 'paygate_paid_call_duration_seconds',
      help: 'Paid calls from the payment record to the paid answer.',
      labelNames: ['protocol'],
      buckets: LATENCY_BUCKETS,
      registers: r,
    })
    const rejections = new Counter({ name: 'paygate_policy_rejections_total', help: 'Payments refused by the policy, by reason.', labelNames: ['reason', ...agent], registers: r })
    this.on('paygate:payment:paid', (m) => {
      payments.inc(this.withAgent({ protocol: m.protocol, rail: m.rail, outcome: 'paid' }, m.agentId))
      paid.inc(this.withAgent({ protocol: m.protocol, rail: m.rail }, m.agentId), usdcFloat(m.amount))
      amounts.observe({ protocol: m.protocol }, usdcFloat(m.amount))
      latency.observe({ protocol: m.protocol }, seconds(m.latencyMs))
    })
    this.on('paygate:payment:failed', (m) => payments.inc(this.withAgent({ protocol: m.protocol, rail: m.rail, outcome: m.held ? 'held' : 'failed' }, m.agentId)))
    this.on('paygate:payment:rejected', (m) => {
      payments.inc(this.withAgent({ protocol: 'none', rail: 'none', outcome: 'rejected' }, m.agentId))
      rejections.inc(this.withAgent({ reason: m.reason }, m.agentId))
    })
  }

  private ledgerAndChain(): void {
    const r = [this.registry]
    const s = this.sources
    new Gauge({ name: 'paygate_ledger_outbox_depth', help: 'Ledger records stored and not yet confirmed on chain.', registers: r, collect: gaugeOf(() => s.outbox.pending()) })
    const lag = new Histogram({
      name: 'paygate_ledger_confirmation_lag_seconds',
      help: 'From a paid record to its ledger record confirmed on chain.',
      buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900],
      registers: r,
    })
    this.on('paygate:ledger:confirmed', (m) => lag.observe(seconds(m.lagMs)))
    const rpc = new Histogram({ name: 'paygate_chain_rpc_duration_seconds', help: 'JSON-RPC calls to the chain, by method.', labelNames: ['method'], buckets: LATENCY_BUCKETS, registers: r })
    const rpcErrors = new Counter({ name: 'paygate_chain_rpc_errors_total', help: 'JSON-RPC calls to the chain that failed, by method.', labelNames: ['method'], registers: r })
    this.on('paygate:chain:rpc', (m) => {
      rpc.observe({ method: m.method }, seconds(m.durationMs))
      if (m.error) rpcErrors.inc({ method: m.method })
    })
  }

  /**
   * A gauge read when scraped, for what other features own (the alerts' delivery queue depth:
   * `registerGauge('paygate_delivery_queue_depth', 'Deliveries waiting.', () => queue.depth())`).
   */
  registerGauge(name: string, help: string, read: () => number | Promise<number>): void {
    new Gauge({
      name,
      help,
      registers: [this.registry],
      async collect() {
        this.set(await read())
      },
    })
  }

  /** A counter that mirrors a count kept elsewhere (read when scraped). */
  private mirror(name: string, help: string, read: () => [Record<string, string>, number][], labelNames: string[] = []): void {
    new Counter({
      name,
      help,
      labelNames,
      registers: [this.registry],
      collect() {
        this.reset()
        for (const [labels, n] of read()) this.inc(labels, n)
      },
    })
  }

  private on<K extends ChannelName>(name: K, fn: (m: ChannelMessages[K]) => void): void {
    const listener = fn as (m: unknown) => void
    subscribe(name, listener)
    this.listeners.push([name, listener])
  }

  /** The exposition text and its content type. */
  async scrape(): Promise<{ contentType: string; text: string }> {
    return { contentType: this.registry.contentType, text: await this.registry.metrics() }
  }

  /** Stop listening (the registry's default-metric collectors go with it). */
  close(): void {
    for (const [name, fn] of this.listeners.splice(0)) unsubscribe(name, fn)
    this.registry.clear()
  }
}

function gaugeOf(read: () => number): (this: promClient.Gauge) => void {
  return function (this: promClient.Gauge) {
    this.set(read())
  }
}
