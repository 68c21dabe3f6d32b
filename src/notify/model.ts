import { AGENT_ID_RE } from '../agents/registry.js'
import { invalid } from '../errors/index.js'
import { RATE_WINDOWS, type RateWindow } from '../policy/model.js'
import { AmountError, parseDecimal } from '../util/money.js'

/** The data notifications keep, and the pure validation of what the API sends for it. */

export const ALERT_TYPES = ['policy_violation', 'budget_pct', 'spend_rate'] as const
export type AlertType = (typeof ALERT_TYPES)[number]
export const SPEC_EVENTS = ['policy.violation', 'budget.warning', 'spend_rate.exceeded'] as const
export type SpecEvent = (typeof SPEC_EVENTS)[number]
export type EventName = SpecEvent | 'alert.test'

/** Alerts per agent, and account webhook endpoints: documented in docs/alerts.md. */
export const MAX_ALERTS_PER_AGENT = 20
export const MAX_WEBHOOK_ENDPOINTS = 10

/**
 * Where an alert's messages go. `sealed`: the stored form of a webhook or Slack channel, where
 * `url` is masked and `sealed` holds the whole URL encrypted (sealed-urls.ts); absent in memory.
 */
export type Channel = { type: 'webhook'; url: string; sealed?: string } | { type: 'email'; address: string } | { type: 'slack'; url: string; sealed?: string }

export interface Alert {
  alertId: string
  agentId: string
  type: AlertType
  /** budget_pct: percent (1-100); spend_rate: USDC as a decimal string of base units. */
  threshold?: number
  /** spend_rate: base units of the threshold. */
  thresholdUnits?: string
  window?: RateWindow
  notify: Channel
  createdAt: string
}

export interface WebhookEndpoint {
  webhookId: string
  url: string
  events: SpecEvent[]
  createdAt: string
  /** Stored form: the whole URL encrypted, `url` masked (sealed-urls.ts); absent in memory. */
  sealed?: string
}

/**
 * What the record hook writes beside a record: a rejection, or a payment with the agent's
 * committed spend in its budget period after it. Expanded into deliveries by the notifier.
 */
export type EventEntry =
  | { id: string; kind: 'violation'; agentId: string; at: number; txId: string; reason: string; detail: string; endpoint: string }
  | {
      id: string
      kind: 'paid'
      agentId: string
      at: number
      txId: string
      amount: string
      usedToday: string
      periodStart: number | null
      dailyBudget?: string | null
      /** The recording process's total of the payment's minute, this payment included (spend_rate's window as of the payment; absent in entries of older versions). */
      minuteAsOf?: { writer: string; units: string }
    }

export type DeliveryStatus = 'pending' | 'delivered' | 'retrying' | 'dropped'
export const DELIVERY_STATUSES: readonly DeliveryStatus[] = ['pending', 'delivered', 'retrying', 'dropped']
/** Why a delivery was dropped: its last retry failed, or what it was for was deleted (it is not attempted again). */
export type DropReason = 'retries_exhausted' | 'alert_deleted' | 'webhook_deleted'

export interface Attempt {
  at: number
  /** HTTP status (SMTP reply code for email), null when none came. */
  status: number | null
  error: string | null
  /** Replicas: the replica that made the attempt (not shown by the API). */
  by?: string
}

export interface Delivery {
  id: string
  event: EventName
  agentId: string
  alertId: string | null
  webhookId: string | null
  channel: Channel
  /** The exact bytes sent on every attempt (the signature covers them). */
  body: string
  status: DeliveryStatus
  attempts: Attempt[]
  /** When the next attempt is due (ms), null once delivered or dropped. */
  nextAt: number | null
  createdAt: number
  updatedAt: number
  /** Why it is dropped (absent while it is not, and on deliveries dropped before this field: their retries ran out). */
  dropReason?: DropReason
  /** When `POST /v1/deliveries/<id>/retry` sent a dropped delivery again. */
  retriedAt?: number[]
  /** Replicas on one database: the replica that attempts it (created or adopted it); absent on LevelDB. Not shown by the API. */
  owner?: string
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v)

function onlyKnown(field: string, v: Record<string, unknown>, keys: readonly string[]): void {
  for (const k of Object.keys(v)) if (!keys.includes(k)) throw invalid(field ? `${field}.${k}` : k, `unknown field ${field ? `${field}.${k}` : k}`)
}

/** An http(s) URL with a host, no fragment; 2048 characters at most. */
export function httpUrl(field: string, v: unknown): string {
  if (typeof v !== 'string' || v.length > 2048) throw invalid(field, `${field} must be an http or https URL (2048 characters at most)`)
  let u: URL
  try {
    u = new URL(v)
  } catch {
    throw invalid(field, `${field} is not a URL`)
  }
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || !u.hostname || u.hash) throw invalid(field, `${field} must be an http or https URL without a fragment`)
  return v
}

const EMAIL_RE = /^[^\s@<>()",;:\\[\]]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$/

export function channelOf(v: unknown, smtpConfigured: boolean): Channel {
  if (!isObject(v)) throw invalid('notify', 'notify must be an object {type, url} or {type: "email", address}')
  const type = v.type
  if (type === 'webhook' || type === 'slack') {
    onlyKnown('notify', v, ['type', 'url'])
    return { type, url: httpUrl('notify.url', v.url) }
  }
  if (type === 'email') {
    onlyKnown('notify', v, ['type', 'address'])
    if (!smtpConfigured) throw invalid('notify.type', 'email notifications need smtp.url and smtp.from in the configuration')
    if (typeof v.address !== 'string' || !EMAIL_RE.test(v.address)) throw invalid('notify.address', 'notify.address must be an e-mail address')
    return { type, address: v.address }
  }
  throw invalid('notify.type', 'notify.type must be one of webhook, email, slack')
}

/** An agent id as a request names it (a body field or a query filter): 400 before any lookup, so a long one is never echoed in a 404. */
export function agentIdOf(v: unknown): string {
  if (typeof v !== 'string') throw invalid('agentId', 'agentId must be a string')
  if (!AGENT_ID_RE.test(v)) throw invalid('agentId', 'agentId must match [A-Za-z0-9._-]{1,64}')
  return v
}

/** What a POST (or a PATCH merged over the stored alert) may set. */
export type AlertInput = Omit<Alert, 'alertId' | 'createdAt'>

/** Validate an alert's fields as a whole (POST, or PATCH merged over the stored alert). */
export function alertInput(body: Record<string, unknown>, smtpConfigured: boolean): AlertInput {
  onlyKnown('', body, ['agentId', 'type', 'threshold', 'window', 'notify'])
  if (body.agentId === undefined || body.agentId === null || body.agentId === '') throw invalid('agentId', 'agentId is required')
  const agentId = agentIdOf(body.agentId)
  const type = body.type
  if (typeof type !== 'string' || !ALERT_TYPES.includes(type as AlertType)) throw invalid('type', `type must be one of ${ALERT_TYPES.join(', ')}`)
  const notify = channelOf(body.notify, smtpConfigured)
  const base = { agentId, notify }
  if (type === 'policy_violation') {
    if (body.threshold !== undefined && body.threshold !== null) throw invalid('threshold', 'policy_violation takes no threshold')
    if (body.window !== undefined && body.window !== null) throw invalid('window', 'policy_violation takes no window')
    return { ...base, type }
  }
  if (type === 'budget_pct') {
    if (body.window !== undefined && body.window !== null) throw invalid('window', 'budget_pct takes no window')
    const t = body.threshold
    if (typeof t !== 'number' || !Number.isFinite(t) || t < 1 || t > 100 || Math.round(t * 100) !== t * 100) {
      throw invalid('threshold', 'threshold of budget_pct must be a percentage from 1 to 100 (two decimals at most)')
    }
    return { ...base, type, threshold: t }
  }
  let units: bigint
  try {
    units = typeof body.threshold === 'number' ? parseDecimal(body.threshold) : -1n
  } catch (e) {
    if (!(e instanceof AmountError)) throw e
    units = -1n
  }
  if (units <= 0n) throw invalid('threshold', 'threshold of spend_rate must be a USDC amount greater than 0 (6 decimals at most)')
  if (typeof body.window !== 'string' || !(body.window in RATE_WINDOWS)) throw invalid('window', `window must be one of ${Object.keys(RATE_WINDOWS).join(', ')}`)
  return { ...base, type: 'spend_rate', threshold: body.threshold as number, thresholdUnits: units.toString(), window: body.window as RateWindow }
}

/** The events an account endpoint asks for (default: the three spec events). */
export function eventsOf(v: unknown): SpecEvent[] {
  if (v === undefined || v === null) return [...SPEC_EVENTS]
  if (!Array.isArray(v) || v.length === 0) throw invalid('events', `events must be a non-empty array of ${SPEC_EVENTS.join(', ')}`)
  const out = new Set<SpecEvent>()
  v.forEach((e, i) => {
    if (!SPEC_EVENTS.includes(e as SpecEvent)) throw invalid(`events[${i}]`, `events[${i}] must be one of ${SPEC_EVENTS.join(', ')}`)
    out.add(e as SpecEvent)
  })
  return [...out]
}
