import t from 'tap'
import { builtInKey, capKey, fire, inert, type Fired, type FireInput } from '../../src/notify/fire.js'
import { maskUrl } from '../../src/notify/mask.js'
import { alertInput, type Alert, type EventEntry } from '../../src/notify/model.js'
import { afterFailure } from '../../src/notify/schedule.js'

/** The firing rules as plain data: which event sends what, and the fired state it leaves. */
const hook = (path: string) => ({ type: 'webhook' as const, url: `http://rx.test/${path}` })
const at = Date.parse('2026-03-01T10:00:30Z')
const paid = (usedUsdc: number, amountUsdc = 0.01, periodStart = at - 3_600_000): EventEntry => ({
  ...{ id: 'ev', kind: 'paid', agentId: 'a', at, txId: 'tx' },
  ...{ amount: String(Math.round(amountUsdc * 1e6)), usedToday: String(Math.round(usedUsdc * 1e6)), periodStart },
})
const alert = (id: string, a: Partial<Alert>): Alert => ({ alertId: id, agentId: 'a', type: 'policy_violation', notify: hook(id), createdAt: '', ...a })
const base = (over: Partial<FireInput>): FireInput => ({
  event: paid(0.01),
  alerts: [],
  endpoints: [],
  fired: new Map(),
  dailyBudget: 100_000n,
  windowSpend: new Map(),
  endpointPerMinute: 60,
  ...over,
})

t.test('policy_violation: every rejection, the spec payload in order', async (t) => {
  const ev: EventEntry = { id: 'ev', kind: 'violation', agentId: 'a', at, txId: 'tx', reason: 'domain_blocked', detail: 'd', endpoint: 'http://x/p' }
  const out = fire(base({ event: ev, alerts: [alert('p', {}), alert('b', { type: 'budget_pct', threshold: 50 })] }))
  t.equal(out.messages.length, 1)
  t.same(out.messages[0]!.payload, { event: 'policy.violation', agentId: 'a', timestamp: '2026-03-01T10:00:30.000Z', reason: 'domain_blocked', detail: 'd', endpoint: 'http://x/p' })
  t.same(fire(base({ event: ev, alerts: [alert('p', {})], fired: out.fired })).messages.length, 1, 'and again at the next')
})

t.test('budget_pct: at the first payment at or over the threshold, once per period', async (t) => {
  const a = alert('b', { type: 'budget_pct', threshold: 50 })
  t.same(fire(base({ event: paid(0.049), alerts: [a] })).messages, [], '49% of 0.1: no')
  const hit = fire(base({ event: paid(0.05), alerts: [a] }))
  t.match(hit.messages, [{ event: 'budget.warning', payload: { threshold: 50, usedPct: 50, usedUsdc: 0.05, dailyBudgetUsdc: 0.1 } }])
  t.same(fire(base({ event: paid(0.06), alerts: [a], fired: hit.fired })).messages, [], 'not twice in the period')
  t.equal(fire(base({ event: paid(0.06, 0.01, at), alerts: [a], fired: hit.fired })).messages.length, 1, 'a new period fires again')
  t.same(fire(base({ event: paid(0.9), alerts: [a], dailyBudget: null })).messages, [], 'no budget, no warning')
})

t.test('the 80% warning: to account endpoints and budget_pct channels; a threshold-80 alert sends one message', async (t) => {
  const a80 = alert('b80', { type: 'budget_pct', threshold: 80 })
  const a50 = alert('b50', { type: 'budget_pct', threshold: 50 })
  const endpoint = { webhookId: 'w', url: 'http://rx.test/acct', events: ['budget.warning' as const], createdAt: '' }
  const out = fire(base({ event: paid(0.08), alerts: [a80, a50], endpoints: [endpoint] }))
  t.same(out.messages.map((m) => `${(m.channel as { url: string }).url}:${m.payload.threshold}`).sort(), [
    'http://rx.test/acct:80',
    'http://rx.test/b50:50',
    'http://rx.test/b50:80',
    'http://rx.test/b80:80',
  ])
  t.same(out.fired.get(builtInKey('a')), { period: at - 3_600_000 })
  const again = fire(base({ event: paid(0.09), alerts: [a80, a50], endpoints: [endpoint], fired: out.fired }))
  t.same(again.messages, [], 'once per period')
})

t.test('spend_rate: fires over the threshold when armed, re-arms at a payment that finds the window at or under it', async (t) => {
  const a = alert('s', { type: 'spend_rate', threshold: 0.015, thresholdUnits: '15000', window: '1h' })
  const run = (spent: number, fired: Map<string, Fired>) => fire(base({ alerts: [a], windowSpend: new Map([['1h', BigInt(spent * 1e6)]]), fired }))
  let state = new Map<string, Fired>()
  const steps: [number, number][] = [
    [0.01, 0],
    [0.02, 1],
    [0.03, 0],
    [0.025, 0], // before it: 0.015, at the threshold: re-armed, 0.025 > 0.015: fires
  ]
  const got: number[] = []
  for (const [spent] of steps) {
    const out = run(spent, state)
    got.push(out.messages.length)
    state = new Map([...state, ...out.fired])
  }
  t.same(got, [0, 1, 0, 1])
  t.match(run(0.02, new Map()).messages[0]!.payload, { event: 'spend_rate.exceeded', window: '1h', spentUsdc: 0.02, thresholdUsdc: 0.015 })
  t.same(run(0.015, new Map()).messages, [], 'equal is not greater')
})

t.test('account endpoints: deduplicated with an alert on the same URL, capped per minute', async (t) => {
  const ev: EventEntry = { id: 'ev', kind: 'violation', agentId: 'a', at, txId: 'tx', reason: 'r', detail: 'd', endpoint: 'e' }
  const endpoint = { webhookId: 'w', url: 'http://rx.test/p', events: ['policy.violation' as const], createdAt: '' }
  t.equal(fire(base({ event: ev, alerts: [alert('p', {})], endpoints: [endpoint] })).messages.length, 1)
  const full = new Map<string, Fired>([[capKey('w'), { minute: at - (at % 60_000), count: 2 }]])
  const out = fire(base({ event: ev, endpoints: [endpoint], fired: full, endpointPerMinute: 2 }))
  t.same([out.messages.length, out.capped.get('w')?.get('policy.violation')], [0, 1], 'over the cap: skipped and counted')
  const next = new Map<string, Fired>([[capKey('w'), { minute: at - (at % 60_000) - 60_000, count: 2 }]])
  t.equal(fire(base({ event: ev, endpoints: [endpoint], fired: next, endpointPerMinute: 2 })).messages.length, 1, 'a new minute')
})

t.test('the retry schedule and validation', async (t) => {
  t.same(
    [1, 2, 3, 4, 5].map((n) => afterFailure(n, 0)),
    [
      { status: 'retrying', nextAt: 60_000 },
      { status: 'retrying', nextAt: 300_000 },
      { status: 'retrying', nextAt: 1_800_000 },
      { status: 'retrying', nextAt: 7_200_000 },
      { status: 'dropped', nextAt: null },
    ],
  )
  t.match(alertInput({ agentId: 'a', type: 'spend_rate', threshold: 0.5, window: '15m', notify: hook('x') }, false), { thresholdUnits: '500000', window: '15m' })
  const fieldOf = (fn: () => unknown): unknown => {
    try {
      fn()
      return null
    } catch (e) {
      return (e as { extra: { field: string } }).extra.field
    }
  }
  t.equal(
    fieldOf(() => alertInput({ agentId: 'a', type: 'budget_pct', threshold: 50.001, notify: hook('x') }, false)),
    'threshold',
  )
  t.equal(
    fieldOf(() => alertInput({ agentId: 'a', type: 'policy_violation', notify: hook('x'), extra: 1 }, false)),
    'extra',
  )
  t.equal(maskUrl('https://hooks.slack.com/services/T/B/secret'), 'https://hooks.slack.com/***')
  t.equal(maskUrl('https://u:pw@rx.test/a/0123456789abcdefghijABCDEFGH?api_key=k&x=1'), 'https://u:***@rx.test/a/***?api_key=***&x=1')
  t.equal(maskUrl('https://rx.test/hook'), 'https://rx.test/hook')
})

t.test('inert: the events that can fire nothing, whatever is stored, are the ones fire() answers with nothing', async (t) => {
  const endpoint = (events: ('budget.warning' | 'policy.violation')[]) => ({ webhookId: 'w', url: 'http://rx.test/acct', events, createdAt: '' })
  const violation: EventEntry = { id: 'ev', kind: 'violation', agentId: 'a', at, txId: 'tx', reason: 'domain_blocked', detail: 'd', endpoint: 'http://x/p' }
  const cases: { name: string; ev: Parameters<typeof inert>[0]; alerts: Alert[]; endpoints: ReturnType<typeof endpoint>[]; want: boolean; fireEv: EventEntry; budget: bigint | null }[] = [
    {
      name: 'paid, no alerts, 79% of the budget',
      ev: { kind: 'paid', usedToday: 79_000n, dailyBudget: 100_000n },
      alerts: [],
      endpoints: [endpoint(['budget.warning'])],
      want: true,
      fireEv: paid(0.079),
      budget: 100_000n,
    },
    {
      name: 'paid, no alerts, 80%: the warning',
      ev: { kind: 'paid', usedToday: 80_000n, dailyBudget: 100_000n },
      alerts: [],
      endpoints: [endpoint(['budget.warning'])],
      want: false,
      fireEv: paid(0.08),
      budget: 100_000n,
    },
    { name: 'paid, no budget', ev: { kind: 'paid', usedToday: 900_000n, dailyBudget: null }, alerts: [], endpoints: [endpoint(['budget.warning'])], want: true, fireEv: paid(0.9), budget: null },
    { name: 'paid, spend today unknown', ev: { kind: 'paid', usedToday: null, dailyBudget: null }, alerts: [], endpoints: [], want: false, fireEv: paid(0.01), budget: null },
    {
      name: 'paid, a spend_rate alert',
      ev: { kind: 'paid', usedToday: 10_000n, dailyBudget: null },
      alerts: [alert('s', { type: 'spend_rate', window: '1h', thresholdUnits: '5000' })],
      endpoints: [],
      want: false,
      fireEv: paid(0.01),
      budget: null,
    },
    {
      name: 'violation, no alert, no endpoint taking it',
      ev: { kind: 'violation' },
      alerts: [alert('b', { type: 'budget_pct', threshold: 50 })],
      endpoints: [endpoint(['budget.warning'])],
      want: true,
      fireEv: violation,
      budget: null,
    },
    { name: 'violation, an endpoint taking it', ev: { kind: 'violation' }, alerts: [], endpoints: [endpoint(['policy.violation'])], want: false, fireEv: violation, budget: null },
    { name: 'violation, a policy_violation alert', ev: { kind: 'violation' }, alerts: [alert('p', {})], endpoints: [], want: false, fireEv: violation, budget: null },
  ]
  for (const c of cases) {
    t.equal(inert(c.ev, c.alerts, c.endpoints), c.want, c.name)
    if (!c.want) continue
    // An inert event is one fire() answers with no message and no changed state.
    const out = fire(base({ event: c.fireEv, alerts: c.alerts, endpoints: c.endpoints, dailyBudget: c.budget }))
    t.same([out.messages, [...out.fired]], [[], []], `${c.name}: fire() agrees`)
  }
})
