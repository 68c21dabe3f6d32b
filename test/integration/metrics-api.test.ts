import { readFileSync } from 'node:fs'
import t from 'tap'
import parsePrometheusTextFormat, { type PromFamily } from 'parse-prometheus-text-format'
import { ProxyAgent, request } from 'undici'
import { newTxId, type TxRecord } from '../../src/ledger/transactions.js'
import { type Resolver, systemResolver } from '../../src/net/egress.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { startFakeCardProvider, startMppMerchant } from '../helpers/mpp-merchant.js'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'

/**
 * The metrics API and /metrics after real paid traffic: x402 and MPP merchants on loopback,
 * paid through POST /v1/pay and through the proxy, policy refusals, an MPP session call.
 */
const card = await startFakeCardProvider({ key: 'card-key' })
t.teardown(() => card.close())
// `blocked.example` is the x402 merchant on loopback (no DNS query leaves this machine).
const resolver: Resolver = async (host) => (host === 'blocked.example' ? [{ address: '127.0.0.1', family: 4 }] : systemResolver(host))
const gw = await startTestGateway({ options: { resolver }, env: { PAYGATE_MPP_CARD_PROVIDER_URL: card.url, PAYGATE_MPP_CARD_PROVIDER_KEY: 'card-key', PAYGATE_PAY_TIMEOUT_MS: '5000' } })
t.teardown(() => gw.close())
const { info, fundedKey, merchantOptions } = await testChain(gw)
const x402 = await startV2Merchant(await merchantOptions(20_000n))
t.teardown(() => x402.close())
const mpp = await startMppMerchant({
  chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token },
  facilitatorKey: await fundedKey(),
  payTo: privateKeyToAccount(generatePrivateKey()).address,
  price: '0.01',
  methods: ['tempo'],
  card,
})
t.teardown(() => mpp.close())

async function agent(id: string, policy?: object): Promise<string> {
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: id } })).body.apiKey as string
  await gw.api('POST', '/v1/wallets', { body: { agentId: id } })
  if (policy) await gw.api('PUT', `/v1/policies/${id}`, { body: policy })
  return key
}
const pay = (agentId: string, endpoint: string) => gw.api('POST', '/v1/pay', { body: { agentId, endpoint, method: 'GET' } })

const buyerKey = await agent('buyer', { dailyBudget: { usdc: 1 } })
const picky = await agent('picky', { perCallLimit: { usdc: 0.001 }, blockedDomains: ['blocked.example'] })

t.test('paid traffic: x402 through the API and the proxy, MPP with a session call, refusals', async (t) => {
  // Paid traffic: two x402 payments through the API, one through the proxy; an MPP payment, then a call on its session.
  for (let i = 0; i < 2; i++) t.equal((await pay('buyer', `${x402.url}/paid`)).status, 200)
  const proxyAgent = new ProxyAgent({ uri: gw.gw.proxyUrl, token: `Basic ${Buffer.from(`buyer:${buyerKey}`).toString('base64')}` })
  t.teardown(() => proxyAgent.close())
  const viaProxy = await request(`${x402.url}/paid`, { dispatcher: proxyAgent })
  await viaProxy.body.dump()
  t.equal(viaProxy.statusCode, 200, 'paid through the proxy')
  t.equal((await pay('buyer', `${mpp.url}/paid`)).status, 200)
  t.equal((await pay('buyer', `${mpp.url}/paid`)).body.session, 'reused')
  // Refusals: two over the per-call limit, one blocked domain.
  for (let i = 0; i < 2; i++) t.equal((await pay('picky', `${x402.url}/paid`)).body.reason, 'per_call_limit_exceeded')
  t.equal((await pay('picky', `http://blocked.example:${new URL(x402.url).port}/paid`)).body.reason, 'domain_blocked')
})

t.test('agent metrics: spend, count and the protocol split over x402 and MPP (defaults: those three, 24h)', async (t) => {
  const r = await gw.api('GET', '/v1/agents/buyer/metrics')
  t.equal(r.status, 200, r.text)
  t.same(r.body.metrics, { spend: { total: 0.07 }, tx_count: 4, protocol_split: { x402: 0.75, mpp: 0.25 } })
  t.equal(r.body.window.precision, 'minute')
  const spec = await gw.api('GET', '/v1/agents/buyer/metrics?metrics=spend,tx_count,protocol_split&window=7d')
  t.same(spec.body.metrics, { spend: { total: 0.07 }, tx_count: 4, protocol_split: { x402: 0.75, mpp: 0.25 } }, "the spec's example call")
})

t.test('the further metrics', async (t) => {
  const all = 'rejected_count,avg_cost,max_cost,top_endpoints,paid_latency,budget_used_pct,session_calls,delegated_spend,spend_series'
  const b = (await gw.api('GET', `/v1/agents/buyer/metrics?metrics=${all}&window=1h`)).body.metrics
  t.same(b.avg_cost, { usdc: 0.0175 })
  t.same(b.max_cost, { usdc: 0.02 })
  t.same(b.top_endpoints, [
    { endpoint: `${x402.url}/paid`, spend: { usdc: 0.06 }, tx_count: 3 },
    { endpoint: `${mpp.url}/paid`, spend: { usdc: 0.01 }, tx_count: 1 },
  ])
  t.ok(b.paid_latency.p50_ms > 0 && b.paid_latency.p95_ms >= b.paid_latency.p50_ms, JSON.stringify(b.paid_latency))
  t.equal(b.budget_used_pct, 7, '0.07 of a 1 USDC daily budget')
  t.equal(b.session_calls, 1)
  t.same(b.delegated_spend, { usdc: 0 })
  t.same(b.rejected_count, { total: 0, by_reason: {} })
  t.equal(b.spend_series.length, 61)
  t.equal(Math.round(b.spend_series.reduce((s: number, p: { usdc: number }) => s + p.usdc, 0) * 1e6), 70_000)
  const p = (await gw.api('GET', '/v1/agents/picky/metrics?metrics=rejected_count,tx_count,budget_used_pct')).body.metrics
  t.same(p, { rejected_count: { total: 3, by_reason: { per_call_limit_exceeded: 2, domain_blocked: 1 } }, tx_count: 0, budget_used_pct: null })
})

t.test('delegated spend: what sub-agents paid inside an invocation (records written through the store layer)', async (t) => {
  // Invocations are built on another branch: their records are written here as the engine writes them.
  const now = Date.now()
  const base = { status: 'pending', createdAt: now, updatedAt: now, endpoint: `${x402.url}/paid`, method: 'GET', protocol: 'x402', txHash: null, parentTxHash: null, depth: 1 } as const
  const write = async (r: TxRecord) => {
    const paid: TxRecord = { ...r, status: 'paid', updatedAt: now + 5 }
    await gw.gw.store.batch([...gw.gw.transactions.ops(paid), ...gw.gw.hooks.ops({ kind: 'paid', record: paid, prev: r })])
  }
  await write({ ...base, id: newTxId(now), agentId: 'buyer', amount: '300000', kind: 'invocation' })
  await write({ ...base, id: newTxId(now), agentId: 'picky', amount: '120000', invocation: { id: 'inv_t', invokers: ['buyer'] } })
  await write({ ...base, id: newTxId(now), agentId: 'buyer', amount: '5000', invocation: { id: 'inv_t', invokers: ['buyer'] } })
  const b = (await gw.api('GET', '/v1/agents/buyer/metrics?metrics=delegated_spend,spend,tx_count')).body.metrics
  t.same(b, { delegated_spend: { usdc: 0.12 }, spend: { total: 0.075 }, tx_count: 5 }, "the root is no spend; the orchestrator's own payment is spend, not delegated")
  const p = (await gw.api('GET', '/v1/agents/picky/metrics?metrics=spend,delegated_spend')).body.metrics
  t.same(p, { spend: { total: 0.12 }, delegated_spend: { usdc: 0 } })
})

t.test('account metrics: summed over agents, by_agent and top spenders; account key only', async (t) => {
  const r = await gw.api('GET', '/v1/metrics?metrics=spend,tx_count,rejected_count')
  t.equal(r.status, 200, r.text)
  t.same(r.body.metrics, { spend: { total: 0.195 }, tx_count: 6, rejected_count: { total: 3, by_reason: { per_call_limit_exceeded: 2, domain_blocked: 1 } } })
  t.same(r.body.by_agent, { buyer: { spend: { total: 0.075 }, tx_count: 5 }, picky: { spend: { total: 0.12 }, tx_count: 1 } })
  t.same(
    r.body.top_spenders.map((s: { agentId: string }) => s.agentId),
    ['picky', 'buyer'],
  )
  t.equal((await gw.api('GET', '/v1/metrics', { key: buyerKey })).status, 403, 'an agent key cannot read the account')
  const bad = await gw.api('GET', '/v1/metrics?metrics=budget_used_pct')
  t.equal(bad.status, 400)
  t.equal(bad.body.field, 'metrics')
})

t.test('agent-key scope and validation', async (t) => {
  t.equal((await gw.api('GET', '/v1/agents/buyer/metrics', { key: buyerKey })).status, 200, 'its own agent')
  const other = await gw.api('GET', '/v1/agents/picky/metrics', { key: buyerKey })
  t.same([other.status, other.body.error], [403, 'forbidden'])
  t.equal((await gw.api('GET', '/v1/agents/buyer/metrics', { key: picky })).status, 403)
  t.equal((await gw.api('GET', '/v1/agents/buyer/metrics', { key: null })).status, 401)
  t.equal((await gw.api('GET', '/v1/agents/nobody/metrics')).status, 404)
  const metric = await gw.api('GET', '/v1/agents/buyer/metrics?metrics=spend,velocity')
  t.same([metric.status, metric.body.error, metric.body.field], [400, 'invalid_request', 'metrics'])
  t.match(metric.body.detail, /velocity.*spend, tx_count, protocol_split, rejected_count/)
  t.ok(metric.body.allowed.includes('delegated_spend'))
  const win = await gw.api('GET', '/v1/agents/buyer/metrics?window=90d')
  t.same([win.status, win.body.field, win.body.allowed], [400, 'window', ['1h', '24h', '7d', '30d']])
  const both = await gw.api('GET', '/v1/agents/buyer/metrics?window=1h&from=2026-01-01T00:00:00Z')
  t.same([both.status, both.body.field], [400, 'window'])
  const range = await gw.api('GET', `/v1/agents/buyer/metrics?from=${new Date(Date.now() - 3_600_000).toISOString()}`)
  t.same(range.body.metrics.tx_count, 5)
  t.equal(Date.parse(range.body.window.to) <= Date.now() && Date.parse(range.body.window.to) > Date.now() - 60_000, true, 'to defaults to now')
  const past = await gw.api('GET', '/v1/agents/buyer/metrics?from=2026-03-01T00:00:00Z&to=2026-03-02T00:00:00Z')
  t.same(past.body.window, { from: '2026-03-01T00:00:00.000Z', to: '2026-03-02T00:00:00.000Z', precision: 'hour' }, 'a past range echoed as asked, not up to now')
  t.same(past.body.metrics.tx_count, 0)
})

const family = (parsed: PromFamily[], name: string): PromFamily => {
  const f = parsed.find((p) => p.name === name)
  if (!f) throw new Error(`no family ${name}`)
  return f
}
const value = (f: PromFamily, labels: Record<string, string> = {}): number =>
  f.metrics.filter((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v)).reduce((s, m) => s + Number(m.value), 0)
/**
 * A histogram's observation count, summed over its series. The parser (prom2json's shape)
 * folds a labelled histogram's series into one bucket map, so its `_count` lines are read
 * from the text; the parser has checked the family and its type.
 */
const histogramCount = (text: string, name: string, labels: Record<string, string> = {}): number => {
  let n = 0
  for (const m of text.matchAll(new RegExp(`^${name}_count(?:\\{([^}]*)\\})? (\\S+)$`, 'gm'))) {
    const got = Object.fromEntries([...(m[1] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]))
    if (Object.entries(labels).every(([k, v]) => got[k] === v)) n += Number(m[2])
  }
  return n
}

t.test('/metrics: Prometheus text format, parsed by a real parser, every family there', async (t) => {
  // An egress denial (cloud metadata) and the ledger records confirmed, so those families have samples.
  t.equal((await pay('buyer', 'http://169.254.169.254/latest')).status, 403)
  t.ok(await gw.gw.outbox.drain(30_000), 'ledger records confirmed')
  const r = await fetch(`${gw.url}/metrics`)
  t.equal(r.status, 200, 'no key needed by default')
  t.match(r.headers.get('content-type'), /^text\/plain; version=0\.0\.4/)
  const text = await r.text()
  const parsed = parsePrometheusTextFormat(text)
  const types = Object.fromEntries(parsed.map((f) => [f.name, f.type]))
  t.match(types, {
    paygate_proxy_requests_total: 'COUNTER',
    paygate_payments_total: 'COUNTER',
    paygate_paid_usdc_total: 'COUNTER',
    paygate_payment_amount_usdc: 'HISTOGRAM',
    paygate_policy_rejections_total: 'COUNTER',
    paygate_upstream_request_duration_seconds: 'HISTOGRAM',
    paygate_paid_call_duration_seconds: 'HISTOGRAM',
    paygate_proxy_open_connections: 'GAUGE',
    paygate_proxy_open_tunnels: 'GAUGE',
    paygate_proxy_auth_failures_total: 'COUNTER',
    paygate_leaf_cert_cache_hits_total: 'COUNTER',
    paygate_leaf_cert_cache_misses_total: 'COUNTER',
    paygate_ledger_outbox_depth: 'GAUGE',
    paygate_ledger_confirmation_lag_seconds: 'HISTOGRAM',
    paygate_delivery_queue_depth: 'GAUGE',
    paygate_chain_rpc_duration_seconds: 'HISTOGRAM',
    paygate_chain_rpc_errors_total: 'COUNTER',
    paygate_egress_denied_total: 'COUNTER',
    process_cpu_seconds_total: 'COUNTER',
    nodejs_eventloop_lag_seconds: 'GAUGE',
  })
  t.equal(value(family(parsed, 'paygate_proxy_requests_total'), { outcome: 'paid' }), 1, 'the proxied payment')
  t.equal(value(family(parsed, 'paygate_payments_total'), { protocol: 'x402', outcome: 'paid' }), 3)
  t.equal(value(family(parsed, 'paygate_payments_total'), { protocol: 'mpp', outcome: 'paid' }), 1)
  t.equal(value(family(parsed, 'paygate_payments_total'), { outcome: 'rejected' }), 3)
  t.equal(Math.round(value(family(parsed, 'paygate_paid_usdc_total'), { rail: 'stablecoin' }) * 1e6), 70_000)
  t.equal(histogramCount(text, 'paygate_payment_amount_usdc'), 4, 'histogram count')
  t.equal(histogramCount(text, 'paygate_paid_call_duration_seconds'), 4)
  t.same(
    [value(family(parsed, 'paygate_policy_rejections_total'), { reason: 'per_call_limit_exceeded' }), value(family(parsed, 'paygate_policy_rejections_total'), { reason: 'domain_blocked' })],
    [2, 1],
  )
  t.ok(histogramCount(text, 'paygate_upstream_request_duration_seconds') >= 1)
  t.ok(histogramCount(text, 'paygate_ledger_confirmation_lag_seconds') >= 4, 'every paid record confirmed')
  t.equal(value(family(parsed, 'paygate_ledger_outbox_depth')), 0)
  t.ok(histogramCount(text, 'paygate_chain_rpc_duration_seconds') > 0)
  t.equal(value(family(parsed, 'paygate_egress_denied_total')), 1, 'the link-local address refused')
  t.equal(value(family(parsed, 'paygate_egress_denied_total'), { reason: 'link_local' }), 1)
  t.equal(value(family(parsed, 'paygate_delivery_queue_depth')), gw.gw.notify.queueDepth(), "the notifier's queue, registered by the gateway")
  t.ok(family(parsed, 'paygate_proxy_open_connections').metrics.length === 1)
  t.ok(value(family(parsed, 'paygate_leaf_cert_cache_hits_total')) + value(family(parsed, 'paygate_leaf_cert_cache_misses_total')) >= 0)
  const labels = new Set(parsed.flatMap((f) => f.metrics.flatMap((m) => Object.keys(m.labels ?? {}))))
  t.notOk(labels.has('agent'), 'no agent labels by default')
  for (const l of labels) t.notMatch(l, /url|endpoint|path|host/, `no URL label (${l})`)
  t.notMatch(text, /127\.0\.0\.1|http:\/\//, 'no URL anywhere in the exposition')
  // The example dashboard uses only names that are exposed.
  const dashboard = readFileSync(new URL('../../docs/grafana-dashboard.json', import.meta.url), 'utf8')
  const used = new Set([...dashboard.matchAll(/\b(paygate_[a-z_]+|process_[a-z_]+|nodejs_[a-z0-9_]+)/g)].map((m) => m[1]!.replace(/_(bucket|count|sum)$/, '')))
  t.ok(used.size >= 15)
  for (const name of used) t.ok(types[name], `the dashboard's ${name} is exposed`)
})
