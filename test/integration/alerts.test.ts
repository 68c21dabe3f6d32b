import t from 'tap'
import type { SpendWindow } from '../../src/notify/spend.js'
import { clockedPayer } from '../helpers/clocked-payer.js'
import { startReceiver, verify } from '../helpers/receiver.js'

/**
 * Alerts end to end on a real gateway, chain and merchant (0.01 USDC a call): which payments
 * fire which alert, exactly once, and what the signed webhooks carry.
 */
const { gw, clock, merchant: m } = await clockedPayer(t, 'a-main')
let secret: string | null = null
const rx = await startReceiver(t, { secret: () => secret })
secret = (await gw.api('GET', '/v1/settings/webhooks')).body.secret

async function agent(id: string, policy: Record<string, unknown>): Promise<() => Promise<number>> {
  await gw.api('POST', '/v1/agents', { body: { agentId: id } })
  await gw.api('POST', '/v1/wallets', { body: { agentId: id } })
  await gw.api('PUT', `/v1/policies/${id}`, { body: policy })
  return async () => (await gw.api('POST', '/v1/pay', { body: { agentId: id, endpoint: `${m.url}/paid` } })).status
}
const alert = async (body: Record<string, unknown>): Promise<string> => {
  const r = await gw.api('POST', '/v1/alerts', { body })
  if (r.status !== 201) throw new Error(r.text)
  return r.body.alertId
}
/** Expand and deliver everything pending, then what reached the receiver since `from`. */
async function since(from: number) {
  await gw.gw.notify.settle()
  return rx.got.slice(from)
}

t.test('alerts: validation names the field; agent keys read their own and cannot write', async (t) => {
  await gw.api('POST', '/v1/agents', { body: { agentId: 'a-val' } })
  const bad = async (body: Record<string, unknown>, field: string) => {
    const r = await gw.api('POST', '/v1/alerts', { body: { agentId: 'a-val', ...body } })
    t.same([r.status, r.body.error, r.body.field], [400, 'invalid_request', field], JSON.stringify(body))
  }
  const hook = { type: 'webhook', url: rx.url }
  await bad({ type: 'policy_violation', threshold: 5, notify: hook }, 'threshold')
  await bad({ type: 'policy_violation', window: '1h', notify: hook }, 'window')
  await bad({ type: 'budget_pct', threshold: 0, notify: hook }, 'threshold')
  await bad({ type: 'budget_pct', threshold: 101, notify: hook }, 'threshold')
  await bad({ type: 'spend_rate', threshold: 0, window: '1h', notify: hook }, 'threshold')
  await bad({ type: 'spend_rate', threshold: 1, window: '2h', notify: hook }, 'window')
  await bad({ type: 'spend_rate', threshold: 1, window: '1h', notify: { type: 'email', address: 'ops@example.com' } }, 'notify.type')
  await bad({ type: 'policy_violation', notify: { type: 'webhook', url: 'ftp://x' } }, 'notify.url')
  await bad({ type: 'nope', notify: hook }, 'type')
  t.equal((await gw.api('POST', '/v1/alerts', { body: { agentId: 'ghost', type: 'policy_violation', notify: hook } })).status, 404)

  const slack = 'https://hooks.slack.com/services/T0001/B0002/abcdefghijklmnopqrstuvwx'
  const id = await alert({ agentId: 'a-val', type: 'spend_rate', threshold: 1.5, window: '1h', notify: { type: 'slack', url: slack } })
  const got = (await gw.api('GET', `/v1/alerts/${id}`)).body
  t.match(got, { alertId: id, agentId: 'a-val', type: 'spend_rate', threshold: 1.5, window: '1h', notify: { type: 'slack', url: 'https://hooks.slack.com/***' } })
  t.notMatch(JSON.stringify(got), /abcdefghij/, 'the Slack URL is masked')
  const tokenUrl = await alert({ agentId: 'a-val', type: 'policy_violation', notify: { type: 'webhook', url: `${rx.url}/hook?token=s3cr3t-value&x=1` } })
  t.match((await gw.api('GET', `/v1/alerts/${tokenUrl}`)).body.notify.url, /token=\*\*\*&x=1$/)

  const key = (await gw.api('POST', '/v1/agents/a-val/keys')).body.apiKey
  t.equal((await gw.api('GET', '/v1/alerts', { key })).body.alerts.length, 2, 'an agent key lists its own alerts')
  t.equal((await gw.api('GET', '/v1/alerts?agentId=a-main', { key })).status, 403)
  t.equal((await gw.api('POST', '/v1/alerts', { key, body: { agentId: 'a-val', type: 'policy_violation', notify: hook } })).status, 403, 'writing takes the account key')
  t.equal((await gw.api('DELETE', `/v1/alerts/${id}`, { key })).status, 403)

  const shown = (await gw.api('GET', `/v1/alerts/${id}`)).body
  const patched = await gw.api('PATCH', `/v1/alerts/${id}`, { body: { threshold: 2, window: '5m', notify: shown.notify } })
  t.equal(gw.gw.notify.book.get(id).notify.type === 'slack' && (gw.gw.notify.book.get(id).notify as { url: string }).url, slack, 'the masked channel sent back keeps the stored URL')
  t.match(patched.body, { threshold: 2, window: '5m', type: 'spend_rate' })
  t.equal((await gw.api('PATCH', `/v1/alerts/${id}`, { body: { window: '7m' } })).body.field, 'window')
  t.equal((await gw.api('DELETE', `/v1/alerts/${id}`)).status, 204)
  t.equal((await gw.api('GET', `/v1/alerts/${id}`)).status, 404)
  await gw.api('DELETE', '/v1/agents/a-val')
  t.same(gw.gw.notify.book.ofAgent('a-val'), [], "an agent's alerts go with it")
  t.equal((await gw.api('GET', '/v1/alerts?agentId=a-val')).status, 404, 'and its id lists as an unknown agent')
})

t.test('policy_violation: every rejection, signed, with the spec payload', async (t) => {
  const pay = await agent('a-pv', { perCallLimit: { usdc: 0.001 } })
  const id = await alert({ agentId: 'a-pv', type: 'policy_violation', notify: { type: 'webhook', url: `${rx.url}/pv` } })
  const from = rx.got.length
  t.equal(await pay(), 402)
  t.equal(await pay(), 402)
  await gw.api('PUT', '/v1/policies/a-pv', { body: { perCallLimit: null, blockedDomains: ['127.0.0.1'] } })
  t.equal(await pay(), 402)
  const got = (await since(from)).filter((r) => r.path === '/pv')
  t.same(
    got.map((r) => r.body.reason),
    ['per_call_limit_exceeded', 'per_call_limit_exceeded', 'domain_blocked'],
  )
  for (const r of got) {
    t.same(Object.keys(r.body), ['event', 'agentId', 'timestamp', 'reason', 'detail', 'endpoint'])
    t.match(r.body, { event: 'policy.violation', agentId: 'a-pv', endpoint: `${m.url}/paid` })
    t.equal(new Date(r.body.timestamp).toISOString(), r.body.timestamp, 'ISO 8601 UTC')
    t.equal(r.verified, true, 'the signature verifies')
    t.match(r.headers['x-paygate-delivery'], /^dl_/)
  }
  t.equal(new Set(got.map((r) => r.headers['x-paygate-delivery'])).size, 3, 'one delivery per rejection')
  const log = (await gw.api('GET', `/v1/deliveries?alertId=${id}&status=delivered`)).body.deliveries
  t.equal(log.length, 3)
  t.match(log[0], { alertId: id, agentId: 'a-pv', event: 'policy.violation', status: 'delivered', attempts: [{ status: 200, error: null }] })
})

t.test('a receiver rejects a tampered body (constant-time check)', async (t) => {
  const signed = rx.got.find((r) => r.verified)!
  const tampered = Buffer.from(signed.raw.toString().replace('"agentId":"', '"agentId":"x'))
  t.equal(verify(secret!, signed.raw, signed.headers['x-service-signature']), true)
  t.equal(verify(secret!, tampered, signed.headers['x-service-signature']), false)
  const r = await fetch(`${rx.url}/pv`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-service-signature': String(signed.headers['x-service-signature']) }, body: tampered })
  t.equal(r.status, 401)
})

t.test('budget_pct and the 80% warning: once per period; an alert at 80 sends one message; a late alert fires at the next payment', async (t) => {
  // 5 payments of 0.01 against 0.05: 20%, 40%, 60%, 80%, 100%.
  const pay = await agent('a-bp', { dailyBudget: { usdc: 0.05 } })
  const wh = (await gw.api('POST', '/v1/webhooks', { body: { url: `${rx.url}/account`, events: ['budget.warning'] } })).body
  t.match(wh, { webhookId: /^wh_/, events: ['budget.warning'] })
  const at50 = await alert({ agentId: 'a-bp', type: 'budget_pct', threshold: 50, notify: { type: 'webhook', url: `${rx.url}/b50` } })
  await alert({ agentId: 'a-bp', type: 'budget_pct', threshold: 80, notify: { type: 'webhook', url: `${rx.url}/b80` } })
  const from = rx.got.length
  const seen = async () => (await since(from)).filter((r) => r.body?.agentId === 'a-bp').map((r) => `${r.path}@${r.body.usedPct}/${r.body.threshold}`)
  t.equal(await pay(), 200)
  t.equal(await pay(), 200)
  t.same(await seen(), [], 'nothing under 50%')
  t.equal(await pay(), 200)
  t.same(await seen(), ['/b50@60/50'], '50% alert at 60%')
  t.equal(await pay(), 200)
  t.same((await seen()).sort(), ['/account@80/80', '/b50@60/50', '/b50@80/80', '/b80@80/80'].sort(), 'at 80%: the account endpoint, and each budget_pct channel once')
  const late = await alert({ agentId: 'a-bp', type: 'budget_pct', threshold: 70, notify: { type: 'webhook', url: `${rx.url}/late` } })
  t.equal(await pay(), 200)
  const all = await seen()
  t.same(
    all.filter((s) => s.startsWith('/late')),
    ['/late@100/70'],
    'created after the crossing: fires at the next payment',
  )
  t.equal(all.length, 5, 'nothing fired twice')
  t.match((await gw.api('GET', `/v1/deliveries?alertId=${late}`)).body.deliveries, [{ event: 'budget.warning', status: 'delivered' }])
  t.equal((await gw.api('GET', `/v1/deliveries?alertId=${at50}`)).body.deliveries.length, 2)
  await gw.api('DELETE', `/v1/webhooks/${wh.webhookId}`)

  // A new period: 24 h after the first payment.
  clock.offset += 24 * 3_600_000
  t.equal(await pay(), 200)
  t.equal(await pay(), 200)
  t.equal(await pay(), 200)
  t.same((await seen()).slice(5), ['/b50@60/50'], 'the next period fires again')
})

t.test('spend_rate: fires when the window passes the threshold, re-arms when a payment finds it at or under', async (t) => {
  const pay = await agent('a-sr', {})
  await alert({ agentId: 'a-sr', type: 'spend_rate', threshold: 0.015, window: '5m', notify: { type: 'webhook', url: `${rx.url}/sr` } })
  const from = rx.got.length
  const fired = async () => (await since(from)).filter((r) => r.path === '/sr').map((r) => r.body)
  // Start at a minute's beginning so the minute buckets are the windows the test means.
  clock.offset += 60_000 - ((Date.now() + clock.offset) % 60_000) + 1000
  t.equal(await pay(), 200)
  t.same(await fired(), [], '0.01 in 5 min: under')
  t.equal(await pay(), 200)
  t.match(await fired(), [{ event: 'spend_rate.exceeded', agentId: 'a-sr', window: '5m', spentUsdc: 0.02, thresholdUsdc: 0.015 }], '0.02 > 0.015')
  t.equal(await pay(), 200)
  t.equal((await fired()).length, 1, 'still over: not again (disarmed)')
  clock.offset += 6 * 60_000
  t.equal(await pay(), 200)
  t.equal((await fired()).length, 1, 'a payment with the window at 0 before it re-arms; 0.01 is not over')
  t.equal(await pay(), 200)
  t.same(
    (await fired()).map((b) => b.spentUsdc),
    [0.02, 0.02],
    'armed again: fires once more',
  )
  t.same(Object.keys((await fired())[0]), ['event', 'agentId', 'timestamp', 'window', 'spentUsdc', 'thresholdUsdc'])
})

t.test('spend_rate: spentUsdc is the window as of the payment that passed it, not with what was paid after it in the same minute', async (t) => {
  const pay = await agent('a-sr2', {})
  await alert({ agentId: 'a-sr2', type: 'spend_rate', threshold: 0.015, window: '1h', notify: { type: 'webhook', url: `${rx.url}/sr2` } })
  const from = rx.got.length
  clock.offset += 60_000 - ((Date.now() + clock.offset) % 60_000) + 1000
  // The window's read of the payment that passes the threshold waits until a later payment of the same minute is recorded.
  const window = (gw.gw.notify.notifier as unknown as { window: SpendWindow }).window
  const spent = window.spent.bind(window)
  let open = () => {}
  const later = new Promise<void>((r) => (open = r))
  let reads = 0
  window.spent = async (...args: Parameters<SpendWindow['spent']>) => {
    if (args[0] === 'a-sr2' && ++reads === 2) await later
    return spent(...args)
  }
  t.teardown(() => {
    window.spent = spent
  })
  t.equal(await pay(), 200)
  t.equal(await pay(), 200) // passes 0.015; its expansion waits
  while (reads < 2) await new Promise((r) => setTimeout(r, 5))
  t.equal(await pay(), 200) // recorded before that expansion reads the window
  open()
  const fired = (await since(from)).filter((r) => r.path === '/sr2').map((r) => r.body)
  t.match(fired, [{ event: 'spend_rate.exceeded', agentId: 'a-sr2', window: '1h', spentUsdc: 0.02 }], 'the window as it stood after the payment that passed it')
})

t.test('account endpoints: default events, deduplicated with an alert on the same URL, capped per minute', async (t) => {
  const pay = await agent('a-acc', { perCallLimit: { usdc: 0.001 } })
  const url = `${rx.url}/same`
  const wh = (await gw.api('POST', '/v1/webhooks', { body: { url } })).body
  t.same(wh.events, ['policy.violation', 'budget.warning', 'spend_rate.exceeded'])
  await alert({ agentId: 'a-acc', type: 'policy_violation', notify: { type: 'webhook', url } })
  const from = rx.got.length
  t.equal(await pay(), 402)
  t.equal((await since(from)).filter((r) => r.path === '/same').length, 1, 'one message per URL and event')
  t.equal((await gw.api('GET', '/v1/webhooks')).body.webhooks.length, 1)
  t.equal((await gw.api('DELETE', `/v1/webhooks/${wh.webhookId}`)).status, 204)
  t.equal((await gw.api('POST', '/v1/webhooks', { body: { url, events: ['nope'] } })).body.field, 'events[0]')
  t.equal((await gw.api('GET', '/v1/webhooks', { key: (await gw.api('POST', '/v1/agents/a-acc/keys')).body.apiKey })).status, 403)
})

t.test('the settings secret: account key only, rotation effective at once', async (t) => {
  const key = (await gw.api('POST', '/v1/agents/a-main/keys')).body.apiKey
  t.equal((await gw.api('GET', '/v1/settings/webhooks', { key })).status, 403)
  const old = secret
  const rotated = (await gw.api('POST', '/v1/settings/webhooks/rotate')).body.secret
  t.not(rotated, old)
  t.equal((await gw.api('GET', '/v1/settings/webhooks')).body.secret, rotated)
  secret = rotated
  const id = await alert({ agentId: 'a-main', type: 'policy_violation', notify: { type: 'webhook', url: `${rx.url}/rot` } })
  const from = rx.got.length
  t.equal((await gw.api('POST', `/v1/alerts/${id}/test`)).status, 202)
  const [r] = (await since(from)).filter((x) => x.path === '/rot')
  t.match(r!.body, { event: 'alert.test', agentId: 'a-main', alertId: id })
  t.equal(r!.verified, true, 'signed with the new secret')
  t.notOk(
    gw.logs.some((l) => l.includes(rotated) || (old !== null && l.includes(old))),
    'the secret is never logged',
  )
})

t.test('deliveries: a failing receiver is retrying with its attempts; retry of a non-dropped delivery is 409', async (t) => {
  const id = await alert({ agentId: 'a-main', type: 'policy_violation', notify: { type: 'webhook', url: `${rx.url}/fail` } })
  rx.setMode('fail')
  t.teardown(() => rx.setMode('ok'))
  await gw.api('POST', `/v1/alerts/${id}/test`)
  await since(0)
  const [d] = (await gw.api('GET', `/v1/deliveries?alertId=${id}`)).body.deliveries
  t.match(d, { status: 'retrying', attempts: [{ status: 500, error: 'answered 500' }] })
  t.equal(Date.parse(d.nextAttemptAt) - Date.parse(d.attempts[0].at), 60_000, 'next attempt 1 min after the failure')
  const r = await gw.api('POST', `/v1/deliveries/${d.deliveryId}/retry`)
  t.same([r.status, r.body.error], [409, 'conflict'])
  t.equal((await gw.api('GET', '/v1/deliveries?status=bogus')).body.field, 'status')
  t.equal(gw.gw.notify.queueDepth() >= 1, true, 'the queue depth counts it')
})

t.test('deleting an alert, its agent or an account endpoint drops what it still had waiting: not attempted again', async (t) => {
  const down = await startReceiver(t)
  down.setMode('fail')
  const pay = await agent('a-del', { perCallLimit: { usdc: 0.001 } })
  const a1 = await alert({ agentId: 'a-del', type: 'policy_violation', notify: { type: 'webhook', url: `${down.url}/a1` } })
  const a2 = await alert({ agentId: 'a-del', type: 'policy_violation', notify: { type: 'webhook', url: `${down.url}/a2` } })
  const wh = (await gw.api('POST', '/v1/webhooks', { body: { url: `${down.url}/wh`, events: ['policy.violation'] } })).body
  t.equal(await pay(), 402)
  await gw.gw.notify.settle()
  t.equal(down.got.length, 3, 'each channel tried once and failed')
  const one = async (q: string) => (await gw.api('GET', `/v1/deliveries?${q}`)).body.deliveries[0]
  const webhookDelivery = async () => (await gw.api('GET', '/v1/deliveries?agentId=a-del')).body.deliveries.find((d: { webhookId: string | null }) => d.webhookId === wh.webhookId)
  t.match(await one(`alertId=${a1}`), { status: 'retrying', dropReason: null })

  t.equal((await gw.api('DELETE', `/v1/alerts/${a1}`)).status, 204)
  const d1 = await one(`alertId=${a1}`)
  t.match(d1, { status: 'dropped', dropReason: 'alert_deleted', nextAttemptAt: null }, "a deleted alert's delivery is dropped, with the reason")
  t.equal((await gw.api('DELETE', `/v1/webhooks/${wh.webhookId}`)).status, 204)
  t.match(await webhookDelivery(), { status: 'dropped', dropReason: 'webhook_deleted' }, "a deleted endpoint's delivery too")
  t.equal((await gw.api('DELETE', '/v1/agents/a-del')).status, 204)
  // The agent's delete answers before its alerts' deliveries are dropped.
  for (let i = 0; i < 100 && (await one(`alertId=${a2}`)).status !== 'dropped'; i++) await new Promise((r) => setTimeout(r, 20))
  t.match(await one(`alertId=${a2}`), { status: 'dropped', dropReason: 'alert_deleted' }, "a deleted agent's alerts' deliveries too")

  clock.offset += 3 * 3_600_000
  await gw.gw.notify.settle()
  t.equal(down.got.length, 3, 'none is attempted again, over the whole retry schedule')
  const r = await gw.api('POST', `/v1/deliveries/${d1.deliveryId}/retry`)
  t.same([r.status, r.body.error], [409, 'conflict'], 'nor retried by hand')
})

t.test("an endpoint over its per-minute cap: one warning for the minute, with the count skipped and the spec's event name", async (t) => {
  const pay = await agent('a-cap', { perCallLimit: { usdc: 0.001 } })
  const wh = (await gw.api('POST', '/v1/webhooks', { body: { url: `${rx.url}/capped`, events: ['policy.violation'] } })).body
  t.teardown(() => gw.api('DELETE', `/v1/webhooks/${wh.webhookId}`))
  const capLines = () => gw.logs.filter((l) => l.includes('per-minute cap')).map((l) => JSON.parse(l))
  const before = capLines().length
  // All in one minute of the gateway's clock: 60 go (notify.endpointPerMinute), 5 are skipped.
  clock.offset += 60_000 - ((Date.now() + clock.offset) % 60_000) + 1000
  for (let i = 0; i < 65; i++) t.equal(await pay(), 402)
  await gw.gw.notify.settle()
  t.equal(rx.got.filter((r) => r.path === '/capped').length, 60, 'the cap holds')
  t.equal(capLines().length, before, 'nothing logged while the minute lasts')
  clock.offset += 60_000
  t.equal(await pay(), 402)
  await gw.gw.notify.settle()
  const lines = capLines().slice(before)
  t.equal(lines.length, 1, 'one warning for the minute')
  t.match(lines[0], { webhookId: wh.webhookId, skipped: 5, events: { 'policy.violation': 5 } })
  t.notOk(
    gw.logs.some((l) => l.includes('"event":"violation"')),
    'no internal event name in the log',
  )
})

t.test('a masked URL sent back with a change is refused (it would be stored with the literal ***)', async (t) => {
  await gw.api('POST', '/v1/agents', { body: { agentId: 'a-mask' } })
  const real = `${rx.url}/ok/wq?token=s3cr3t-value&x=1`
  const id = await alert({ agentId: 'a-mask', type: 'policy_violation', notify: { type: 'webhook', url: real } })
  const shown = (await gw.api('GET', `/v1/alerts/${id}`)).body.notify
  t.equal(shown.url, `${rx.url}/ok/wq?token=***&x=1`)
  const refused = async (r: { status: number; body: { error: string; field: string; detail: string } }, field: string, what: string) => {
    t.same([r.status, r.body.error, r.body.field], [400, 'invalid_request', field], what)
    t.match(r.body.detail, /full URL/)
  }
  await refused(await gw.api('PATCH', `/v1/alerts/${id}`, { body: { notify: { ...shown, url: shown.url.replace('x=1', 'x=2') } } }), 'notify.url', 'PATCH: the masked URL changed')
  await refused(await gw.api('PATCH', `/v1/alerts/${id}`, { body: { notify: { ...shown, url: shown.url.replace('***', '%2A%2A%2A') } } }), 'notify.url', 'PATCH: the mask percent-encoded')
  t.equal((gw.gw.notify.book.get(id).notify as { url: string }).url, real, 'the stored URL is unchanged')
  t.equal((await gw.api('PATCH', `/v1/alerts/${id}`, { body: { notify: shown } })).status, 200, 'sent back exactly as shown: kept')
  t.equal((gw.gw.notify.book.get(id).notify as { url: string }).url, real)
  const changed = `${rx.url}/ok/wq?token=n3w-value&x=2`
  t.equal((await gw.api('PATCH', `/v1/alerts/${id}`, { body: { notify: { type: 'webhook', url: changed } } })).status, 200, 'the full URL: taken')
  t.equal((gw.gw.notify.book.get(id).notify as { url: string }).url, changed)
  await refused(await gw.api('POST', '/v1/alerts', { body: { agentId: 'a-mask', type: 'policy_violation', notify: shown } }), 'notify.url', 'POST /v1/alerts')
  await refused(
    await gw.api('POST', '/v1/alerts', { body: { agentId: 'a-mask', type: 'policy_violation', notify: { type: 'slack', url: 'https://hooks.slack.com/***' } } }),
    'notify.url',
    'a masked Slack URL',
  )
  await refused(await gw.api('POST', '/v1/webhooks', { body: { url: shown.url } }), 'url', 'POST /v1/webhooks')
})

t.test('agentId: 400 when malformed (never echoed), "must be a string"; listings 404 for an agent that does not exist', async (t) => {
  const hook = { type: 'webhook', url: rx.url }
  const long = 'x'.repeat(3000)
  const r = await gw.api('POST', '/v1/alerts', { body: { agentId: long, type: 'policy_violation', notify: hook } })
  t.same([r.status, r.body.error, r.body.field, r.body.detail], [400, 'invalid_request', 'agentId', 'agentId must match [A-Za-z0-9._-]{1,64}'], 'as PUT /v1/policies answers')
  t.notOk(r.text.includes(long), 'the id is not echoed')
  const n = await gw.api('POST', '/v1/alerts', { body: { agentId: 5, type: 'policy_violation', notify: hook } })
  t.same([n.status, n.body.field, n.body.detail], [400, 'agentId', 'agentId must be a string'])
  t.equal((await gw.api('POST', '/v1/alerts', { body: { type: 'policy_violation', notify: hook } })).body.detail, 'agentId is required')
  for (const path of ['/v1/alerts', '/v1/deliveries']) {
    const unknown = await gw.api('GET', `${path}?agentId=nosuch`)
    t.same([unknown.status, unknown.body.error], [404, 'not_found'], `${path}: an unknown agent`)
    t.equal((await gw.api('GET', `${path}?agentId=${long}`)).status, 400, `${path}: a malformed one`)
  }
  await gw.api('POST', '/v1/agents', { body: { agentId: 'a-none' } })
  t.same((await gw.api('GET', '/v1/alerts?agentId=a-none')).body.alerts, [], 'an agent without alerts: an empty list')
  t.same((await gw.api('GET', '/v1/deliveries?agentId=a-none')).body.deliveries, [])
  // A deleted agent's delivery log stays listed (only an empty page looks the agent up).
  await gw.api('POST', '/v1/agents', { body: { agentId: 'a-gone' } })
  const id = await alert({ agentId: 'a-gone', type: 'policy_violation', notify: { type: 'webhook', url: `${rx.url}/gone` } })
  await gw.api('POST', `/v1/alerts/${id}/test`)
  await gw.gw.notify.settle()
  await gw.api('DELETE', '/v1/agents/a-gone')
  t.equal((await gw.api('GET', '/v1/deliveries?agentId=a-gone')).body.deliveries.length, 1)
})
