import t from 'tap'
import parsePrometheusTextFormat from 'parse-prometheus-text-format'
import { channels } from '../../src/events/channels.js'
import { PrometheusMetrics, type PromSources } from '../../src/metrics/prometheus.js'

/**
 * The registry on its own: the components' counters are plain data here, the channels are
 * the real ones. Agent labels only with `metrics.agentLabels`; listening stops at close.
 */
const sources: PromSources = {
  proxy: { counters: { authFailures: 3, tunnels: 2 }, connections: 5, leafCache: () => ({ hits: 7, misses: 1, size: 1 }) },
  egress: { counters: { byReason: { metadata: 1, private: 4 } } },
  outbox: { pending: () => 9 },
}
const samples = async (p: PrometheusMetrics, name: string) => parsePrometheusTextFormat((await p.scrape()).text).find((f) => f.name === name)?.metrics ?? []

t.test('agent labels only when asked for', async (t) => {
  for (const agentLabels of [false, true]) {
    const p = new PrometheusMetrics(sources, { agentLabels })
    t.teardown(() => p.close())
    channels.paymentPaid.publish({ agentId: 'a1', transactionId: 'tx_1', protocol: 'x402', rail: 'stablecoin', amount: 2_500_000n, latencyMs: 40 })
    channels.paymentRejected.publish({ agentId: 'a1', transactionId: 'tx_2', reason: 'daily_budget_exceeded' })
    channels.proxyRequest.publish({ agentId: 'a1', method: 'GET', status: 200, paid: null, error: undefined, durationMs: 12 })
    const paid = await samples(p, 'paygate_paid_usdc_total')
    t.same(paid, [{ labels: { protocol: 'x402', rail: 'stablecoin', ...(agentLabels ? { agent: 'a1' } : {}) }, value: '2.5' }])
    t.same((await samples(p, 'paygate_policy_rejections_total'))[0]?.labels, { reason: 'daily_budget_exceeded', ...(agentLabels ? { agent: 'a1' } : {}) })
    t.same((await samples(p, 'paygate_proxy_requests_total'))[0]?.labels, { outcome: 'passed', ...(agentLabels ? { agent: 'a1' } : {}) })
    p.close()
  }
})

t.test('a failed or held payment is counted under its own rail; a rejection under none', async (t) => {
  const p = new PrometheusMetrics(sources, { agentLabels: false })
  t.teardown(() => p.close())
  channels.paymentFailed.publish({ agentId: 'a1', transactionId: 'tx_3', protocol: 'mpp', rail: 'card', held: false, error: 'expired' })
  channels.paymentFailed.publish({ agentId: 'a1', transactionId: 'tx_4', protocol: 'x402', rail: 'stablecoin', held: true, error: 'no answer' })
  channels.paymentRejected.publish({ agentId: 'a1', transactionId: 'tx_5', reason: 'domain_blocked' })
  t.same(
    (await samples(p, 'paygate_payments_total')).map((m) => m.labels),
    [
      { protocol: 'mpp', rail: 'card', outcome: 'failed' },
      { protocol: 'x402', rail: 'stablecoin', outcome: 'held' },
      { protocol: 'none', rail: 'none', outcome: 'rejected' },
    ],
  )
})

t.test('gauges and mirrored counters read the components when scraped; registered gauges too', async (t) => {
  const p = new PrometheusMetrics(sources, { agentLabels: false })
  t.teardown(() => p.close())
  p.registerGauge('paygate_delivery_queue_depth', 'Deliveries waiting.', async () => 4)
  t.same(await samples(p, 'paygate_proxy_open_connections'), [{ value: '5' }])
  t.same(await samples(p, 'paygate_proxy_open_tunnels'), [{ value: '2' }])
  t.same(await samples(p, 'paygate_proxy_auth_failures_total'), [{ value: '3' }])
  t.same(await samples(p, 'paygate_leaf_cert_cache_hits_total'), [{ value: '7' }])
  t.same(await samples(p, 'paygate_ledger_outbox_depth'), [{ value: '9' }])
  t.same(await samples(p, 'paygate_delivery_queue_depth'), [{ value: '4' }])
  t.same(await samples(p, 'paygate_egress_denied_total'), [
    { labels: { reason: 'metadata' }, value: '1' },
    { labels: { reason: 'private' }, value: '4' },
  ])
  sources.proxy.counters.authFailures = 10
  t.same(await samples(p, 'paygate_proxy_auth_failures_total'), [{ value: '10' }], 'mirrors, not adds')
})

t.test('closed: no longer listening', async (t) => {
  const p = new PrometheusMetrics(sources, { agentLabels: false })
  p.close()
  t.notOk(channels.paymentPaid.hasSubscribers, 'nobody subscribed: publishers skip building messages')
})
