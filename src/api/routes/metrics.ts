import type { Registry } from '../../agents/registry.js'
import type { Aggregates } from '../../metrics/aggregates.js'
import type { PrometheusMetrics } from '../../metrics/prometheus.js'
import { ACCOUNT_METRICS, AGENT_METRICS, accountMetrics, parseMetrics, render, sumAgent } from '../../metrics/query.js'
import { resolveWindow, spanEnd, type Span } from '../../metrics/windows.js'
import type { PolicyStore } from '../../policy/store.js'
import { usedToday } from '../../policy/usage.js'
import type { Clock } from '../../util/clock.js'
import { requireAgentAccess, type Route } from '../router.js'

export interface MetricsDeps {
  aggregates: Aggregates
  registry: Registry
  policies: PolicyStore
  clock: Clock
}

/** The span a request asks for, from `window` or `from`/`to`. */
function spanOf(url: URL, now: number): Span {
  const q = url.searchParams
  return resolveWindow({ window: q.get('window'), from: q.get('from'), to: q.get('to') }, now)
}

const windowView = (span: Span, now: number) => ({ from: new Date(span.from).toISOString(), to: new Date(spanEnd(span, now)).toISOString(), precision: span.precision })

/** Committed spend today against the daily budget, in percent (null without a budget). */
async function budgetUsedPct(policies: PolicyStore, agentId: string, now: number): Promise<number | null> {
  const policy = await policies.policyOf(agentId)
  if (policy.dailyBudget === undefined) return null
  const budget = BigInt(policy.dailyBudget)
  if (budget === 0n) return null
  return Number((usedToday(await policies.usageOf(agentId), now) * 10000n) / budget) / 100
}

/** `GET /v1/agents/<id>/metrics` and `GET /v1/metrics`, read from the per-agent aggregates. */
export function metricsRoutes(d: MetricsDeps): Route[] {
  return [
    {
      method: 'GET',
      path: '/v1/agents/:id/metrics',
      access: 'agent',
      async handler(ctx) {
        const agentId = ctx.params.id!
        requireAgentAccess(ctx.identity, agentId)
        await d.registry.requireAgent(agentId)
        const names = parseMetrics(ctx.url.searchParams.get('metrics'), AGENT_METRICS)
        const now = d.clock.now()
        const span = spanOf(ctx.url, now)
        const series = names.includes('spend_series') ? new Map<number, bigint>() : null
        const sum = sumAgent(await d.aggregates.view(agentId, span), span, names.includes('top_endpoints'), series)
        const pct = names.includes('budget_used_pct') ? await budgetUsedPct(d.policies, agentId, now) : null
        return { status: 200, body: { agentId, window: windowView(span, now), metrics: render(names, sum, span, series, pct) } }
      },
    },
    {
      method: 'GET',
      path: '/v1/metrics',
      access: 'account',
      async handler(ctx) {
        const names = parseMetrics(ctx.url.searchParams.get('metrics'), ACCOUNT_METRICS)
        const now = d.clock.now()
        const span = spanOf(ctx.url, now)
        return { status: 200, body: { window: windowView(span, now), ...accountMetrics(names, await d.aggregates.accountView(span), span) } }
      },
    },
  ]
}

/**
 * `GET /metrics`, Prometheus text format: public, or behind the account key with
 * `metrics.requireKey`. Added to the router before anything the dashboard serves, so a
 * catch-all for `/` never shadows it.
 */
export function prometheusRoute(prom: PrometheusMetrics, requireKey: boolean): Route {
  return {
    method: 'GET',
    path: '/metrics',
    access: requireKey ? 'account' : 'public',
    async handler() {
      const { contentType, text } = await prom.scrape()
      return { status: 200, raw: { contentType, data: text }, headers: { 'cache-control': 'no-store' } }
    },
  }
}
