import { RATE_WINDOWS, type RateWindow } from '../policy/model.js'
import { toUsdcNumber } from '../util/money.js'
import type { Alert, Channel, EventEntry, EventName, SpecEvent, WebhookEndpoint } from './model.js'

/**
 * When alerts fire: a pure decision over one event entry, the agent's alerts, the account's
 * webhook endpoints and the per-alert "fired" state. The notifier writes what it returns
 * (deliveries and the changed state) in one batch.
 */

/** budget_pct: the period it last fired in. spend_rate: whether it may fire. Endpoint caps: the minute and how many went. */
export interface Fired {
  period?: number | null
  armed?: boolean
  minute?: number
  count?: number
}

/** The daily budget's own warning (spec: at 80%), once per period, keyed per agent in the fired state. */
export const BUDGET_WARNING_PCT = 80
export const builtInKey = (agentId: string): string => `budget80\u0000${agentId}`
export const capKey = (webhookId: string): string => `cap\u0000${webhookId}`

export interface Message {
  event: EventName
  /** The spec's payload: `event`, `agentId`, `timestamp` and the event's fields, in that order. */
  payload: Record<string, unknown>
  channel: Channel
  alertId: string | null
  webhookId: string | null
}

export interface FireInput {
  event: EventEntry
  alerts: readonly Alert[]
  endpoints: readonly WebhookEndpoint[]
  fired: ReadonlyMap<string, Fired>
  /** The agent's daily budget (base units) or null without one. */
  dailyBudget: bigint | null
  /** paid events: the agent's spend in each window its spend_rate alerts use, this payment included. */
  windowSpend: ReadonlyMap<RateWindow, bigint>
  /** At most this many deliveries per account endpoint per minute; past it they are skipped. */
  endpointPerMinute: number
}

export interface FireOutput {
  messages: Message[]
  /** Changed state only. */
  fired: Map<string, Fired>
  /** Deliveries an endpoint's cap skipped, by webhookId and event. */
  capped: Map<string, Map<SpecEvent, number>>
}

const payloadOf = (event: SpecEvent | 'alert.test', agentId: string, at: number, fields: Record<string, unknown>): Record<string, unknown> => ({
  event,
  agentId,
  timestamp: new Date(at).toISOString(),
  ...fields,
})

function budgetFields(threshold: number, used: bigint, budget: bigint): Record<string, unknown> {
  return { threshold, usedPct: Number((used * 10000n) / budget) / 100, usedUsdc: toUsdcNumber(used), dailyBudgetUsdc: toUsdcNumber(budget) }
}

const reached = (used: bigint, budget: bigint, pct: number): boolean => used * 10000n >= BigInt(Math.round(pct * 100)) * budget

const channelKey = (c: Channel): string => (c.type === 'email' ? `email:${c.address.toLowerCase()}` : `${c.type}:${c.url}`)

/** Per-alert messages of a paid event (budget_pct, the 80% warning, spend_rate). */
function paidMessages(inp: FireInput, ev: Extract<EventEntry, { kind: 'paid' }>, out: FireOutput): { alert: Message[]; account: SpecEvent[]; fields: Map<SpecEvent, Record<string, unknown>> } {
  const alert: Message[] = []
  const account: SpecEvent[] = []
  const fields = new Map<SpecEvent, Record<string, unknown>>()
  const used = BigInt(ev.usedToday)
  const budget = inp.dailyBudget
  const mk = (a: Alert, event: SpecEvent, f: Record<string, unknown>): Message => ({ event, payload: payloadOf(event, ev.agentId, ev.at, f), channel: a.notify, alertId: a.alertId, webhookId: null })
  const budgetAlerts = inp.alerts.filter((a) => a.type === 'budget_pct')
  if (budget !== null && budget > 0n) {
    for (const a of budgetAlerts) {
      const state = inp.fired.get(a.alertId)
      if (!reached(used, budget, a.threshold!) || (state && state.period === ev.periodStart)) continue
      out.fired.set(a.alertId, { period: ev.periodStart })
      alert.push(mk(a, 'budget.warning', budgetFields(a.threshold!, used, budget)))
    }
    const key = builtInKey(ev.agentId)
    const state = inp.fired.get(key)
    if (reached(used, budget, BUDGET_WARNING_PCT) && !(state && state.period === ev.periodStart)) {
      out.fired.set(key, { period: ev.periodStart })
      const f = budgetFields(BUDGET_WARNING_PCT, used, budget)
      fields.set('budget.warning', f)
      account.push('budget.warning')
      for (const a of budgetAlerts) alert.push(mk(a, 'budget.warning', f))
    }
  }
  const amount = BigInt(ev.amount)
  for (const a of inp.alerts) {
    if (a.type !== 'spend_rate') continue
    const after = inp.windowSpend.get(a.window!) ?? amount
    const threshold = BigInt(a.thresholdUnits!)
    const state = inp.fired.get(a.alertId)
    let armed = state?.armed ?? true
    // Re-armed by a payment before which the window's spend was at or under the threshold.
    if (!armed && after - amount <= threshold) armed = true
    if (armed && after > threshold) {
      armed = false
      const f = { window: a.window, spentUsdc: toUsdcNumber(after), thresholdUsdc: toUsdcNumber(threshold) }
      alert.push(mk(a, 'spend_rate.exceeded', f))
    }
    if (armed !== (state?.armed ?? true)) out.fired.set(a.alertId, { armed })
  }
  return { alert, account, fields }
}

/** The messages an event sends, deduplicated per channel and payload, and the fired state that changes. */
export function fire(inp: FireInput): FireOutput {
  const out: FireOutput = { messages: [], fired: new Map(), capped: new Map() }
  const ev = inp.event
  let alertMsgs: Message[]
  let accountEvents: SpecEvent[]
  let fields: Map<SpecEvent, Record<string, unknown>>
  if (ev.kind === 'violation') {
    const f = { reason: ev.reason, detail: ev.detail, endpoint: ev.endpoint }
    alertMsgs = inp.alerts
      .filter((a) => a.type === 'policy_violation')
      .map((a) => ({ event: 'policy.violation' as const, payload: payloadOf('policy.violation', ev.agentId, ev.at, f), channel: a.notify, alertId: a.alertId, webhookId: null }))
    accountEvents = ['policy.violation']
    fields = new Map([['policy.violation', f]])
  } else {
    ;({ alert: alertMsgs, account: accountEvents, fields } = paidMessages(inp, ev, out))
  }
  const seen = new Set<string>()
  const add = (m: Message): boolean => {
    const k = `${channelKey(m.channel)}\u0000${JSON.stringify(m.payload)}`
    if (seen.has(k)) return false
    seen.add(k)
    out.messages.push(m)
    return true
  }
  for (const m of alertMsgs) add(m)
  const minute = ev.at - (ev.at % 60_000)
  for (const event of accountEvents) {
    for (const w of inp.endpoints) {
      if (!w.events.includes(event)) continue
      const m: Message = { event, payload: payloadOf(event, ev.agentId, ev.at, fields.get(event)!), channel: { type: 'webhook', url: w.url }, alertId: null, webhookId: w.webhookId }
      const k = capKey(w.webhookId)
      const prev = out.fired.get(k) ?? inp.fired.get(k)
      const count = prev && prev.minute === minute ? prev.count! : 0
      if (count >= inp.endpointPerMinute) {
        const skipped = out.capped.get(w.webhookId) ?? new Map<SpecEvent, number>()
        out.capped.set(w.webhookId, skipped.set(event, (skipped.get(event) ?? 0) + 1))
        continue
      }
      if (add(m)) out.fired.set(k, { minute, count: count + 1 })
    }
  }
  return out
}

/**
 * Whether an event can send nothing and change no fired state, whatever is stored: then its
 * entry need not be written (or expanded) at all. Paid: the agent has no alerts, and its spend
 * today, this payment included, is under the built-in 80% warning of a daily budget (or it has
 * none). Violation: the agent has no policy_violation alert and no account endpoint takes
 * policy.violation. `usedToday` null: not known, so not inert.
 */
export function inert(ev: { kind: 'paid'; usedToday: bigint | null; dailyBudget: bigint | null } | { kind: 'violation' }, alerts: readonly Alert[], endpoints: readonly WebhookEndpoint[]): boolean {
  if (ev.kind === 'violation') return !alerts.some((a) => a.type === 'policy_violation') && !endpoints.some((w) => w.events.includes('policy.violation'))
  if (alerts.length || ev.usedToday === null) return false
  return ev.dailyBudget === null || ev.dailyBudget <= 0n || !reached(ev.usedToday, ev.dailyBudget, BUDGET_WARNING_PCT)
}

/** The windows whose spend a paid event needs (those of the agent's spend_rate alerts), with their length. */
export const windowsOf = (alerts: readonly Alert[]): Map<RateWindow, number> => new Map(alerts.filter((a) => a.type === 'spend_rate').map((a) => [a.window!, RATE_WINDOWS[a.window!]]))

export const testPayload = (alert: Alert, at: number): Record<string, unknown> => payloadOf('alert.test', alert.agentId, at, { alertId: alert.alertId, type: alert.type })
