/**
 * One agent's aggregates for one minute or hour, and the pure arithmetic on them: adding a
 * payment, a rejection, a session call or delegated spend; merging buckets; the latency
 * histogram. Amounts are bigint base units; stored as decimal strings.
 */
export interface EndpointTotals {
  spend: bigint
  n: number
}

export interface Bucket {
  /** Paid payments from the agent's own wallet (invocation roots excluded). */
  paid: number
  spend: bigint
  x402: number
  mpp: number
  max: bigint
  rejected: Record<string, number>
  sessions: number
  /** What sub-agents paid inside this agent's invocations. */
  delegated: bigint
  /** Latency histogram: bucket index (see `latencyIndex`) -> count. */
  latency: Record<number, number>
  /** By origin + path; past the cap per agent and hour, under OTHER_ENDPOINT. */
  endpoints: Map<string, EndpointTotals>
  /** The account's buckets only: paid payments and spend by agent (`by_agent`, top spenders). */
  byAgent?: Map<string, EndpointTotals>
}

export const OTHER_ENDPOINT = 'other'
/** Distinct endpoints kept per agent and hour; more fold into `other`. */
export const ENDPOINTS_PER_HOUR = 50

export const emptyBucket = (): Bucket => ({ paid: 0, spend: 0n, x402: 0, mpp: 0, max: 0n, rejected: {}, sessions: 0, delegated: 0n, latency: {}, endpoints: new Map() })

/**
 * Latency buckets on a fixed log scale, four per doubling: index 0 is [0, 1) ms, index i >= 1
 * is [2^((i-1)/4), 2^(i/4)) ms, the last one open-ended (from about 4.7 h). A percentile is
 * reported as its bucket's geometric middle, so it is within 2^(1/8) - 1 (about 9.1%) of the
 * true value (0.5 ms absolute below 1 ms).
 */
export const LATENCY_STEPS_PER_DOUBLING = 4
export const LATENCY_MAX_INDEX = 1 + 24 * LATENCY_STEPS_PER_DOUBLING

export function latencyIndex(ms: number): number {
  if (!(ms >= 1)) return 0
  return Math.min(LATENCY_MAX_INDEX, 1 + Math.floor(Math.log2(ms) * LATENCY_STEPS_PER_DOUBLING))
}

/** The value reported for a latency bucket (ms). */
export function latencyValue(index: number): number {
  if (index === 0) return 0.5
  return 2 ** ((index - 0.5) / LATENCY_STEPS_PER_DOUBLING)
}

/** The `q` quantile (0..1) of a histogram, or null when it is empty. */
export function quantile(hist: Record<number, number>, q: number): number | null {
  const idx = Object.keys(hist)
    .map(Number)
    .sort((a, b) => a - b)
  let total = 0
  for (const i of idx) total += hist[i]!
  if (total === 0) return null
  const rank = Math.max(1, Math.ceil(q * total))
  let seen = 0
  for (const i of idx) {
    seen += hist[i]!
    if (seen >= rank) return latencyValue(i)
  }
  return latencyValue(idx[idx.length - 1]!)
}

export interface PaidFacts {
  amount: bigint
  protocol: 'x402' | 'mpp' | null
  latencyMs: number
  /** The endpoint as counted: the real one or OTHER_ENDPOINT (see `endpointKey`). */
  endpoint: string
}

export function addPaid(b: Bucket, p: PaidFacts): void {
  b.paid++
  b.spend += p.amount
  if (p.protocol === 'x402') b.x402++
  else if (p.protocol === 'mpp') b.mpp++
  if (p.amount > b.max) b.max = p.amount
  const i = latencyIndex(p.latencyMs)
  b.latency[i] = (b.latency[i] ?? 0) + 1
  const e = b.endpoints.get(p.endpoint)
  if (e) {
    e.spend += p.amount
    e.n++
  } else b.endpoints.set(p.endpoint, { spend: p.amount, n: 1 })
}

/** A paid payment of `agentId` into an account bucket's by-agent totals. */
export function addByAgent(b: Bucket, agentId: string, amount: bigint): void {
  b.byAgent ??= new Map()
  const e = b.byAgent.get(agentId)
  if (e) {
    e.spend += amount
    e.n++
  } else b.byAgent.set(agentId, { spend: amount, n: 1 })
}

export function addRejected(b: Bucket, reason: string): void {
  b.rejected[reason] = (b.rejected[reason] ?? 0) + 1
}

/** The endpoint key a payment counts under in an hour bucket: itself while the hour has room, else `other`. */
export function endpointKey(hour: Bucket, endpoint: string): string {
  if (hour.endpoints.has(endpoint)) return endpoint
  let distinct = hour.endpoints.size
  if (hour.endpoints.has(OTHER_ENDPOINT)) distinct--
  return distinct < ENDPOINTS_PER_HOUR ? endpoint : OTHER_ENDPOINT
}

/** Add `b` into `into` (the endpoints too only when `endpoints`: they cost the most). */
export function mergeInto(into: Bucket, b: Bucket, endpoints: boolean): void {
  into.paid += b.paid
  into.spend += b.spend
  into.x402 += b.x402
  into.mpp += b.mpp
  if (b.max > into.max) into.max = b.max
  for (const r in b.rejected) into.rejected[r] = (into.rejected[r] ?? 0) + b.rejected[r]!
  into.sessions += b.sessions
  into.delegated += b.delegated
  for (const i in b.latency) into.latency[i as unknown as number] = (into.latency[i as unknown as number] ?? 0) + b.latency[i as unknown as number]!
  if (endpoints) mergeEndpoints(into.endpoints, b.endpoints)
  if (b.byAgent) mergeEndpoints((into.byAgent ??= new Map()), b.byAgent)
}

export function mergeEndpoints(into: Map<string, EndpointTotals>, from: Map<string, EndpointTotals>): void {
  for (const [k, e] of from) {
    const have = into.get(k)
    if (have) {
      have.spend += e.spend
      have.n += e.n
    } else into.set(k, { spend: e.spend, n: e.n })
  }
}

/** A bucket as stored: short keys, zero fields left out, amounts as decimal strings. */
export interface StoredBucket {
  p?: number
  s?: string
  x?: number
  m?: number
  mx?: string
  r?: Record<string, number>
  sc?: number
  d?: string
  l?: Record<string, number>
  e?: Record<string, [string, number]>
  /** By agent (account buckets): [spend, count]. */
  a?: Record<string, [string, number]>
}

export const totalsEntry = (e: EndpointTotals): [string, number] => [e.spend.toString(), e.n]

const totalsOut = (m: Map<string, EndpointTotals>): Record<string, [string, number]> => {
  const out: Record<string, [string, number]> = {}
  for (const [k, v] of m) out[k] = totalsEntry(v)
  return out
}

function totalsIn(m: Map<string, EndpointTotals>, s: Record<string, [string, number]>): void {
  for (const k in s) {
    const [spend, n] = s[k]!
    m.set(k, { spend: BigInt(spend), n })
  }
}

/** `maps` false: without the endpoint and by-agent maps (the account stores each entry under its own key). */
export function encodeBucket(b: Bucket, maps = true): StoredBucket {
  const out: StoredBucket = {}
  if (b.paid) {
    out.p = b.paid
    out.s = b.spend.toString()
    out.x = b.x402
    out.m = b.mpp
    out.mx = b.max.toString()
    out.l = b.latency
    if (maps) out.e = totalsOut(b.endpoints)
    if (maps && b.byAgent) out.a = totalsOut(b.byAgent)
  }
  if (Object.keys(b.rejected).length) out.r = b.rejected
  if (b.sessions) out.sc = b.sessions
  if (b.delegated) out.d = b.delegated.toString()
  return out
}

export function decodeBucket(s: StoredBucket): Bucket {
  const b = emptyBucket()
  b.paid = s.p ?? 0
  b.spend = BigInt(s.s ?? '0')
  b.x402 = s.x ?? 0
  b.mpp = s.m ?? 0
  b.max = BigInt(s.mx ?? '0')
  b.rejected = { ...(s.r ?? {}) }
  b.sessions = s.sc ?? 0
  b.delegated = BigInt(s.d ?? '0')
  for (const [i, n] of Object.entries(s.l ?? {})) b.latency[Number(i)] = n
  if (s.e) totalsIn(b.endpoints, s.e)
  if (s.a) totalsIn((b.byAgent = new Map()), s.a)
  return b
}

/** A bucket's stored JSON with its maps in key order: equal counts compare equal whatever order they came in. */
export function canonical(b: Bucket): string {
  const s = encodeBucket(b)
  const sorted = <T>(o: Record<string, T> | undefined) => (o ? Object.fromEntries(Object.entries(o).sort(([a], [c]) => (a < c ? -1 : a > c ? 1 : 0))) : undefined)
  return JSON.stringify({ ...s, r: sorted(s.r), e: sorted(s.e), a: sorted(s.a) })
}
