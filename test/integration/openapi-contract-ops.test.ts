import t from 'tap'
import { OffsetClock } from '../../src/util/clock.js'
import { AREAS, MAX_BODY_BYTES, assertCoverage, concrete, contractGateway, sweep401, sweep405, sweep429 } from '../helpers/contract-sweeps.js'
import { startReceiver } from '../helpers/receiver.js'

/**
 * The API contract, part 3 of 3 (alerts, webhook endpoints and their secret, the delivery
 * log): every route of this area driven for real, its success and each documented error,
 * every answer held to docs/openapi.json. The clock is moved to walk a failing delivery
 * through its retries until it is dropped, so that retrying it can be answered.
 */
const clock = new OffsetClock()
const { gw, contract, call } = await contractGateway(t, undefined, clock)
const acct = gw.accountKey
const rx = await startReceiver(t)

let keyA = ''
let keyB = ''
let alertId = ''
const hook = { type: 'webhook', url: `${rx.url}/hook` }

t.test('setup: two agents', async (t) => {
  keyA = (await call(t, { method: 'POST', path: '/v1/agents', key: acct, body: { agentId: 'o-a' } }, 201)).body.apiKey
  keyB = (await call(t, { method: 'POST', path: '/v1/agents', key: acct, body: { agentId: 'o-b' } }, 201)).body.apiKey
})

t.test('alerts', async (t) => {
  const made = await call(t, { method: 'POST', path: '/v1/alerts', key: acct, body: { agentId: 'o-a', type: 'spend_rate', threshold: 1.5, window: '1h', notify: hook } }, 201)
  alertId = made.body.alertId
  await call(t, { method: 'POST', path: '/v1/alerts', key: acct, body: { agentId: 'o-a', type: 'budget_pct', threshold: 50, notify: { type: 'email', address: 'ops@example.com' } } }, 400)
  t.equal((await call(t, { method: 'POST', path: '/v1/alerts', key: acct, body: { agentId: 'o-a', type: 'nope', notify: hook } }, 400, 'invalid_request')).body.field, 'type')
  await call(t, { method: 'POST', path: '/v1/alerts', key: keyA, body: { agentId: 'o-a', type: 'policy_violation', notify: hook } }, 403, 'forbidden')
  await call(t, { method: 'POST', path: '/v1/alerts', key: acct, body: { agentId: 'ghost', type: 'policy_violation', notify: hook } }, 404, 'not_found')
  for (let i = 0; i < 20; i++) await call(t, { method: 'POST', path: '/v1/alerts', key: acct, body: { agentId: 'o-b', type: 'policy_violation', notify: hook } }, 201)
  await call(t, { method: 'POST', path: '/v1/alerts', key: acct, body: { agentId: 'o-b', type: 'policy_violation', notify: hook } }, 409, 'conflict')

  await call(t, { method: 'GET', path: '/v1/alerts', key: acct }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/alerts', key: keyA }, 200)).body.alerts.length, 1)
  await call(t, { method: 'GET', path: '/v1/alerts?agentId=o-b', key: keyA }, 403, 'forbidden')
  t.equal((await call(t, { method: 'GET', path: `/v1/alerts?agentId=${'x'.repeat(65)}`, key: acct }, 400, 'invalid_request')).body.field, 'agentId')
  await call(t, { method: 'GET', path: '/v1/alerts?agentId=ghost', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: `/v1/alerts/${alertId}`, key: keyA }, 200)
  await call(t, { method: 'GET', path: '/v1/alerts/al_nothing', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: `/v1/alerts/${alertId}`, key: keyB }, 403, 'forbidden')

  await call(t, { method: 'PATCH', path: `/v1/alerts/${alertId}`, key: acct, body: { threshold: 2 } }, 200)
  t.equal((await call(t, { method: 'PATCH', path: `/v1/alerts/${alertId}`, key: acct, body: { agentId: 'o-b' } }, 400, 'invalid_request')).body.field, 'agentId')
  await call(t, { method: 'PATCH', path: '/v1/alerts/al_nothing', key: acct, body: { threshold: 2 } }, 404, 'not_found')
  await call(t, { method: 'PATCH', path: `/v1/alerts/${alertId}`, key: keyA, body: { threshold: 3 } }, 403, 'forbidden')

  const gone = (await call(t, { method: 'POST', path: '/v1/alerts', key: acct, body: { agentId: 'o-a', type: 'policy_violation', notify: hook } }, 201)).body.alertId
  await call(t, { method: 'DELETE', path: `/v1/alerts/${gone}`, key: acct }, 204)
  await call(t, { method: 'DELETE', path: `/v1/alerts/${gone}`, key: acct }, 404, 'not_found')
  await call(t, { method: 'DELETE', path: `/v1/alerts/${alertId}`, key: keyA }, 403, 'forbidden')
})

t.test('webhook endpoints and the signing secret', async (t) => {
  const made = await call(t, { method: 'POST', path: '/v1/webhooks', key: acct, body: { url: `${rx.url}/account`, events: ['policy.violation'] } }, 201)
  t.equal((await call(t, { method: 'POST', path: '/v1/webhooks', key: acct, body: { url: 'ftp://x' } }, 400, 'invalid_request')).body.field, 'url')
  await call(t, { method: 'POST', path: '/v1/webhooks', key: keyA, body: { url: `${rx.url}/account` } }, 403, 'forbidden')
  for (let i = 1; i < 10; i++) await call(t, { method: 'POST', path: '/v1/webhooks', key: acct, body: { url: `${rx.url}/account-${i}` } }, 201)
  await call(t, { method: 'POST', path: '/v1/webhooks', key: acct, body: { url: `${rx.url}/one-too-many` } }, 409, 'conflict')
  await call(t, { method: 'GET', path: '/v1/webhooks', key: acct }, 200)
  await call(t, { method: 'GET', path: '/v1/webhooks', key: keyA }, 403, 'forbidden')
  const id = made.body.webhookId
  await call(t, { method: 'GET', path: `/v1/webhooks/${id}`, key: acct }, 200)
  await call(t, { method: 'GET', path: '/v1/webhooks/wh_nothing', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: `/v1/webhooks/${id}`, key: keyA }, 403, 'forbidden')
  await call(t, { method: 'DELETE', path: `/v1/webhooks/${id}`, key: keyA }, 403, 'forbidden')
  await call(t, { method: 'DELETE', path: `/v1/webhooks/${id}`, key: acct }, 204)
  await call(t, { method: 'DELETE', path: `/v1/webhooks/${id}`, key: acct }, 404, 'not_found')

  await call(t, { method: 'GET', path: '/v1/settings/webhooks', key: acct }, 200)
  await call(t, { method: 'GET', path: '/v1/settings/webhooks', key: keyA }, 403, 'forbidden')
  await call(t, { method: 'POST', path: '/v1/settings/webhooks/rotate', key: acct }, 200)
  t.equal((await call(t, { method: 'POST', path: '/v1/settings/webhooks/rotate', key: acct, body: { secret: 'mine' } }, 400, 'invalid_request')).body.field, 'secret')
  await call(t, { method: 'POST', path: '/v1/settings/webhooks/rotate', key: keyA }, 403, 'forbidden')
})

t.test('the delivery log: a failing delivery retried until dropped, then sent again', async (t) => {
  rx.setMode('fail')
  t.teardown(() => rx.setMode('ok'))
  await call(t, { method: 'POST', path: `/v1/alerts/${alertId}/test`, key: acct }, 202)
  await call(t, { method: 'POST', path: '/v1/alerts/al_nothing/test', key: acct }, 404, 'not_found')
  await call(t, { method: 'POST', path: `/v1/alerts/${alertId}/test`, key: keyA }, 403, 'forbidden')
  await gw.gw.notify.settle()
  const list = await call(t, { method: 'GET', path: `/v1/deliveries?alertId=${alertId}`, key: acct }, 200)
  const d = list.body.deliveries[0]
  t.equal(d.status, 'retrying')
  await call(t, { method: 'GET', path: '/v1/deliveries', key: keyA }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/deliveries?status=bogus', key: acct }, 400, 'invalid_request')).body.field, 'status')
  await call(t, { method: 'GET', path: '/v1/deliveries?agentId=o-a', key: keyB }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/deliveries?agentId=ghost', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: `/v1/deliveries/${d.deliveryId}`, key: keyA }, 200)
  await call(t, { method: 'GET', path: '/v1/deliveries/dl_nothing', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: `/v1/deliveries/${d.deliveryId}`, key: keyB }, 403, 'forbidden')
  const retry = `/v1/deliveries/${d.deliveryId}/retry`
  await call(t, { method: 'POST', path: retry, key: acct }, 409, 'conflict')
  // 1 min, 5 min, 30 min, 2 h: each retry fails, then the delivery is dropped.
  for (let i = 0; i < 4; i++) {
    clock.offset += 3 * 3600_000
    gw.gw.notify.queue.kick()
    await gw.gw.notify.settle()
  }
  t.equal((await call(t, { method: 'GET', path: `/v1/deliveries/${d.deliveryId}`, key: acct }, 200)).body.status, 'dropped')
  t.equal((await call(t, { method: 'POST', path: retry, key: acct, body: { now: true } }, 400, 'invalid_request')).body.field, 'now')
  await call(t, { method: 'POST', path: '/v1/deliveries/dl_nothing/retry', key: acct }, 404, 'not_found')
  await call(t, { method: 'POST', path: retry, key: keyA }, 403, 'forbidden')
  rx.setMode('ok')
  await call(t, { method: 'POST', path: retry, key: acct }, 202)
})

t.test('bodies over the limit: 413 on every operation of this area that takes one', async (t) => {
  const big = { pad: 'x'.repeat(MAX_BODY_BYTES + 100) }
  for (const path of AREAS.ops) {
    for (const method of contract.methodsOf(path)) {
      if (!contract.doc.paths[path][method.toLowerCase()].requestBody) continue
      await call(t, { method, path: concrete(path), key: acct, body: big }, 413, 'payload_too_large')
    }
  }
})

t.test('401 without a valid key, 405 for an undocumented method, 429 past the rate', async (t) => {
  await sweep401(t, gw, contract, 'ops')
  await sweep405(t, gw, contract, 'ops')
  await sweep429(t, gw, contract, 'ops')
})

t.test('coverage: every documented status of this area answered, nothing undocumented seen', async (t) => {
  assertCoverage(t, contract, 'ops')
})
