import { toUsdcNumber, usdc } from '../util/money.js'
import type { AgentBuckets } from './agent-buckets.js'
import { emptyBucket, mergeInto, quantile, type Bucket } from './buckets.js'
import { DAY_MS, floorTo, HOUR_MS, MINUTE_MS, seriesStarts, unknownValue, type Span } from './windows.js'

/** The metrics an agent's call may ask for, in the order they are listed in a 400. */
export const AGENT_METRICS = [
  'spend',
  'tx_count',
  'protocol_split',
  'rejected_count',
  'avg_cost',
  'max_cost',
  'top_endpoints',
  'paid_latency',
  'budget_used_pct',
  'session_calls',
  'delegated_spend',
  'spend_series',
] as const
export type MetricName = (typeof AGENT_METRICS)[number]
/** The account's: the same, summed, without `budget_used_pct` (budgets are per agent). */
export const ACCOUNT_METRICS: readonly MetricName[] = AGENT_METRICS.filter((m) => m !== 'budget_used_pct')
export const DEFAULT_METRICS: readonly MetricName[] = ['spend', 'tx_count', 'protocol_split']
export const TOP_ENDPOINTS = 10
export const TOP_SPENDERS = 10

/** `metrics=a,b` (absent: the defaults); 400 naming `metrics` and the allowed values for an unknown one. */
export function parseMetrics(v: string | null, allowed: readonly MetricName[]): MetricName[] {
  if (v === null) return [...DEFAULT_METRICS]
  const out: MetricName[] = []
  for (const raw of v.split(',')) {
    const name = raw.trim()
    if (!(allowed as readonly string[]).includes(name)) throw unknownValue('metrics', name, allowed)
    if (!out.includes(name as MetricName)) out.push(name as MetricName)
  }
  return out
}

/**
 * The sum of one agent's buckets in `span`, with endpoints only when asked (they cost the
 * most) and each bucket's spend added to `series` at its step when given. The coarsest
 * buckets that fit are read: minutes only at the edges of a minute-exact span, whole hours
 * and whole UTC days in between (a coarser bucket is exactly the sum of its finer ones).
 */
export function sumAgent(a: AgentBuckets | undefined, span: Span, endpoints: boolean, series: Map<number, bigint> | null): Bucket {
  const out = emptyBucket()
  if (!a) return out
  const add = (t: number, b: Bucket): void => {
    mergeInto(out, b, endpoints)
    if (series && b.spend) {
      const at = floorTo(t, span.step)
      series.set(at, (series.get(at) ?? 0n) + b.spend)
    }
  }
  // Whole coarse buckets inside the span are read from the coarse level (hours for minute
  // precision, UTC days for hour precision), unless the series is finer than that level.
  const [fine, coarse, fineMs, coarseMs] = span.precision === 'minute' ? [a.minutes, a.hours, MINUTE_MS, HOUR_MS] : [a.hours, a.days, HOUR_MS, DAY_MS]
  const first = Math.ceil(span.from / coarseMs) * coarseMs
  const end = Math.floor((span.last + fineMs) / coarseMs) * coarseMs
  if ((series && span.step < coarseMs) || first >= end) {
    walk(fine, span.from, span.last, fineMs, add)
    return out
  }
  walk(fine, span.from, first - fineMs, fineMs, add)
  walk(coarse, first, end - coarseMs, coarseMs, add)
  walk(fine, end, span.last, fineMs, add)
  return out
}

/** Each bucket of `m` starting in [from, last], stepping by `size`; a sparse map is walked instead of the range. */
function walk(m: Map<number, Bucket>, from: number, last: number, size: number, add: (t: number, b: Bucket) => void): void {
  if (last < from) return
  if ((last - from) / size + 1 > m.size) {
    for (const [t, b] of m) if (t >= from && t <= last) add(t, b)
    return
  }
  for (let t = from; t <= last; t += size) {
    const b = m.get(t)
    if (b) add(t, b)
  }
}

const round = (n: number, digits: number): number => Math.round(n * 10 ** digits) / 10 ** digits

function protocolSplit(b: Bucket): { x402: number; mpp: number } {
  const n = b.x402 + b.mpp
  if (n === 0) return { x402: 0, mpp: 0 }
  // Each share divided on its own: 1 - 0.8 is 0.19999999999999996, 1 / 5 is 0.2 (and the two still sum to 1).
  return { x402: b.x402 / n, mpp: b.mpp / n }
}

function topEndpoints(b: Bucket): { endpoint: string; spend: { usdc: number }; tx_count: number }[] {
  return [...b.endpoints]
    .sort(([ka, a], [kb, c]) => (a.spend === c.spend ? c.n - a.n || (ka < kb ? -1 : 1) : a.spend > c.spend ? -1 : 1))
    .slice(0, TOP_ENDPOINTS)
    .map(([endpoint, e]) => ({ endpoint, spend: usdc(e.spend), tx_count: e.n }))
}

function latency(b: Bucket): { p50_ms: number | null; p95_ms: number | null } {
  const at = (q: number): number | null => {
    const v = quantile(b.latency, q)
    return v === null ? null : round(v, 2)
  }
  return { p50_ms: at(0.5), p95_ms: at(0.95) }
}

/** The answer's `metrics` object for the asked metrics, from a summed bucket. */
export function render(names: readonly MetricName[], b: Bucket, span: Span, series: Map<number, bigint> | null, budgetUsedPct: number | null = null): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const name of names) {
    switch (name) {
      case 'spend':
        out.spend = { total: toUsdcNumber(b.spend) }
        break
      case 'tx_count':
        out.tx_count = b.paid
        break
      case 'protocol_split':
        out.protocol_split = protocolSplit(b)
        break
      case 'rejected_count':
        out.rejected_count = { total: Object.values(b.rejected).reduce((s, n) => s + n, 0), by_reason: b.rejected }
        break
      case 'avg_cost':
        out.avg_cost = usdc(b.paid ? b.spend / BigInt(b.paid) : 0n)
        break
      case 'max_cost':
        out.max_cost = usdc(b.max)
        break
      case 'top_endpoints':
        out.top_endpoints = topEndpoints(b)
        break
      case 'paid_latency':
        out.paid_latency = latency(b)
        break
      case 'budget_used_pct':
        out.budget_used_pct = budgetUsedPct
        break
      case 'session_calls':
        out.session_calls = b.sessions
        break
      case 'delegated_spend':
        out.delegated_spend = usdc(b.delegated)
        break
      case 'spend_series':
        out.spend_series = seriesStarts(span).map((t) => ({ t: new Date(t).toISOString(), usdc: toUsdcNumber(series?.get(t) ?? 0n) }))
        break
    }
  }
  return out
}

/**
 * The account's answer, from the account's own buckets (kept beside the agents' in the same
 * writes, each the sum of the agents' buckets of its minute or hour): the total, and `by_agent`
 * and the top spenders from their by-agent totals.
 */
export function accountMetrics(
  names: readonly MetricName[],
  account: AgentBuckets,
  span: Span,
): { metrics: Record<string, unknown>; by_agent: Record<string, { spend: { total: number }; tx_count: number }>; top_spenders: { agentId: string; spend: { total: number }; tx_count: number }[] } {
  const series = names.includes('spend_series') ? new Map<number, bigint>() : null
  const total = sumAgent(account, span, names.includes('top_endpoints'), series)
  const per = [...(total.byAgent ?? [])].sort(([ia, a], [ib, b]) => (a.spend === b.spend ? (ia < ib ? -1 : 1) : a.spend > b.spend ? -1 : 1))
  const by_agent: Record<string, { spend: { total: number }; tx_count: number }> = {}
  for (const [agentId, e] of per) by_agent[agentId] = { spend: { total: toUsdcNumber(e.spend) }, tx_count: e.n }
  const top_spenders = per.slice(0, TOP_SPENDERS).map(([agentId, e]) => ({ agentId, spend: { total: toUsdcNumber(e.spend) }, tx_count: e.n }))
  return { metrics: render(names, total, span, series), by_agent, top_spenders }
}
