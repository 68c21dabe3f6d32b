import { invalid } from '../errors/index.js'
import { AmountError, MAX_USDC_UNITS, parseDecimal, usdc } from '../util/money.js'
import { normalizeHost } from './domains.js'
import { DAY_MS, HOUR_MS, paymentsThisHour, sessionCallsOf, usedToday, type UsageState } from './usage.js'

export const RATE_WINDOWS = { '1m': 60_000, '5m': 300_000, '15m': 900_000, '1h': HOUR_MS, '24h': DAY_MS } as const
export type RateWindow = keyof typeof RATE_WINDOWS
export const PREFERENCES = ['auto', 'x402', 'mpp'] as const
export type ProtocolPreference = (typeof PREFERENCES)[number]

const MAX_DOMAINS = 1000
/**
 * Below 2^33 USDC doubles are closer together than 0.000001, so a JSON number there parses back
 * to exactly the 6-decimal amount written; from 2^33 up it may not (8999999999.999999 reads as
 * 8999999999.999998).
 */
const EXACT_NUMBER_BOUND_USDC = 2 ** 33
const MAX_RATE_CALLS = 1_000_000

/** A policy as stored: amounts as decimal strings of base units. Unset limits are absent. */
export interface StoredPolicy {
  dailyBudget?: string
  perCallLimit?: string
  allowedDomains?: string[]
  blockedDomains: string[]
  rateLimit?: { calls: number; window: RateWindow }
  protocolPreference: ProtocolPreference
  updatedAt?: string
}

export const defaultPolicy = (): StoredPolicy => ({ blockedDomains: [], protocolPreference: 'auto' })

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v)

/** Unknown fields inside an object are refused as at the top level; `known` includes what a GET shows (read-only). */
function onlyKnown(field: string, v: Record<string, unknown>, known: readonly string[]): void {
  for (const k of Object.keys(v)) if (!known.includes(k)) throw invalid(`${field}.${k}`, `unknown policy field ${field}.${k}`)
}

/** `dailyBudget` and `perCallLimit`; `readOnly` is what a GET adds (`usedToday`). */
function amount(field: string, v: unknown, readOnly: readonly string[] = []): string {
  if (!isObject(v)) throw invalid(field, `${field} must be an object {usdc: number}`)
  onlyKnown(field, v, ['usdc', ...readOnly])
  if (!('usdc' in v)) throw invalid(field, `${field} must be an object {usdc: number}`)
  const raw = v.usdc
  if (typeof raw !== 'number' && typeof raw !== 'string') throw invalid(`${field}.usdc`, `${field}.usdc must be a number`)
  if (typeof raw === 'number' && raw >= EXACT_NUMBER_BOUND_USDC) {
    throw invalid(`${field}.usdc`, `${field}.usdc of ${EXACT_NUMBER_BOUND_USDC} or more cannot be exact as a JSON number; send it as a decimal string`)
  }
  let units: bigint
  try {
    units = parseDecimal(raw)
  } catch (e) {
    const why = e instanceof AmountError ? e.message : 'is not a valid amount'
    throw invalid(`${field}.usdc`, `${field}.usdc ${why}`)
  }
  if (units <= 0n) throw invalid(`${field}.usdc`, `${field}.usdc must be positive`)
  if (units > MAX_USDC_UNITS) throw invalid(`${field}.usdc`, `${field}.usdc must be at most 1000000000000`)
  return units.toString()
}

function domains(field: string, v: unknown): string[] {
  if (!Array.isArray(v)) throw invalid(field, `${field} must be an array of domain names`)
  if (v.length > MAX_DOMAINS) throw invalid(field, `${field} holds at most ${MAX_DOMAINS} entries`)
  const out = new Set<string>()
  v.forEach((e, i) => {
    const host = typeof e === 'string' ? normalizeHost(e) : null
    if (!host) {
      throw invalid(
        `${field}[${i}]`,
        `${field}[${i}] ${JSON.stringify(e)} is not a hostname, localhost or IP literal (no scheme, port, path, wildcard, \\ or %; IPv4 as four decimal octets; a bare domain covers its subdomains)`,
      )
    }
    out.add(host)
  })
  return [...out]
}

function rateLimit(v: unknown): { calls: number; window: RateWindow } {
  if (!isObject(v)) throw invalid('rateLimit', 'rateLimit must be an object {calls, window}')
  onlyKnown('rateLimit', v, ['calls', 'window', 'usedThisHour'])
  const { calls, window } = v
  if (typeof calls !== 'number' || !Number.isInteger(calls) || calls < 1 || calls > MAX_RATE_CALLS) {
    throw invalid('rateLimit.calls', `rateLimit.calls must be an integer from 1 to ${MAX_RATE_CALLS}`)
  }
  if (typeof window !== 'string' || !(window in RATE_WINDOWS)) {
    throw invalid('rateLimit.window', `rateLimit.window must be one of ${Object.keys(RATE_WINDOWS).join(', ')}`)
  }
  return { calls, window: window as RateWindow }
}

/** Fields a client may send back unchanged from a GET (read-only, ignored). */
const READ_ONLY = new Set(['agentId', 'updatedAt', 'sessionCalls'])
const FIELDS = new Set(['dailyBudget', 'perCallLimit', 'allowedDomains', 'blockedDomains', 'rateLimit', 'protocolPreference'])

/**
 * Merge a PUT body into the current policy. Given fields replace, `null` removes an
 * optional field (blockedDomains becomes [], protocolPreference `auto`), absent fields stay.
 */
export function mergePolicy(current: StoredPolicy, body: unknown, agentId: string): StoredPolicy {
  if (!isObject(body)) throw invalid('body', 'the body must be a JSON object of policy fields')
  for (const k of Object.keys(body)) {
    if (!FIELDS.has(k) && !READ_ONLY.has(k)) throw invalid(k, `unknown policy field ${k}`)
  }
  if ('agentId' in body && body.agentId !== agentId) throw invalid('agentId', 'agentId in the body differs from the path')
  const next: StoredPolicy = { ...current }
  const has = (k: string): boolean => k in body
  if (has('dailyBudget')) {
    if (body.dailyBudget === null) delete next.dailyBudget
    else next.dailyBudget = amount('dailyBudget', body.dailyBudget, ['usedToday'])
  }
  if (has('perCallLimit')) {
    if (body.perCallLimit === null) delete next.perCallLimit
    else next.perCallLimit = amount('perCallLimit', body.perCallLimit)
  }
  if (has('allowedDomains')) {
    if (body.allowedDomains === null) delete next.allowedDomains
    else next.allowedDomains = domains('allowedDomains', body.allowedDomains)
  }
  if (has('blockedDomains')) next.blockedDomains = body.blockedDomains === null ? [] : domains('blockedDomains', body.blockedDomains)
  if (has('rateLimit')) {
    if (body.rateLimit === null) delete next.rateLimit
    else next.rateLimit = rateLimit(body.rateLimit)
  }
  if (has('protocolPreference')) {
    const p = body.protocolPreference
    if (p === null) next.protocolPreference = 'auto'
    else if (typeof p === 'string' && (PREFERENCES as readonly string[]).includes(p)) next.protocolPreference = p as ProtocolPreference
    else throw invalid('protocolPreference', `protocolPreference must be one of ${PREFERENCES.join(', ')}`)
  }
  return next
}

/** The policy as the API reads it back, with usage from stored payments. */
export function policyView(agentId: string, p: StoredPolicy, usage: UsageState, now: number): Record<string, unknown> {
  const view: Record<string, unknown> = { agentId }
  if (p.dailyBudget !== undefined) view.dailyBudget = { ...usdc(BigInt(p.dailyBudget)), usedToday: usdc(usedToday(usage, now)).usdc }
  if (p.perCallLimit !== undefined) view.perCallLimit = usdc(BigInt(p.perCallLimit))
  if (p.allowedDomains !== undefined) view.allowedDomains = p.allowedDomains
  view.blockedDomains = p.blockedDomains
  if (p.rateLimit) view.rateLimit = { ...p.rateLimit, usedThisHour: paymentsThisHour(usage, now) }
  view.protocolPreference = p.protocolPreference
  view.sessionCalls = sessionCallsOf(usage, now)
  if (p.updatedAt) view.updatedAt = p.updatedAt
  return view
}
