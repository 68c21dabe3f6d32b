import t from 'tap'
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { LevelStore } from '../../src/store/level.js'
import { Store } from '../../src/store/index.js'
import { startTestGateway, testChain, testDir } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { startReceiver } from '../helpers/receiver.js'

/**
 * Notification URLs are stored encrypted (src/notify/sealed-urls.ts): an alert's webhook URL,
 * an account endpoint's URL and every delivery's hold their tokens nowhere in the store, and
 * deliveries still go to the whole URL, after a restart too. Rows an earlier version stored in
 * the clear are sealed at start.
 */
const TOKEN = 'abcdefghijklmnopqrstuvwxyz012345'
const SECRET = 's3cr3t-alert-value'
const EP_SECRET = 'ep-s3cr3t-value'

/** Every value in the store, as JSON text, and every file of the data dir's write-ahead log. */
async function storedText(dataDir: string): Promise<string> {
  const store = await LevelStore.open(dataDir)
  let all = ''
  try {
    for await (const [coll, key, value] of store.dump()) all += `${coll} ${key} ${value}\n`
  } finally {
    await store.close()
  }
  const walk = (d: string): void => {
    for (const f of readdirSync(d)) {
      const p = join(d, f)
      if (statSync(p).isDirectory()) walk(p)
      else if (/wal/i.test(p)) all += readFileSync(p).toString('latin1')
    }
  }
  walk(dataDir)
  return all
}

t.test('alert, endpoint and delivery URLs are stored encrypted, and deliveries still reach the whole URL', async (t) => {
  const dataDir = testDir(t)
  const rx = await startReceiver(t)
  const alertUrl = `${rx.url}/hook/${TOKEN}?token=${SECRET}`
  const endpointUrl = `${rx.url}/ep?token=${EP_SECRET}`
  let gw = await startTestGateway({ dataDir })
  const m = await startV2Merchant(await (await testChain(gw)).merchantOptions(10_000n))
  t.teardown(() => m.close())
  await gw.api('POST', '/v1/agents', { body: { agentId: 'sealer' } })
  await gw.api('POST', '/v1/wallets', { body: { agentId: 'sealer' } })
  await gw.api('PUT', '/v1/policies/sealer', { body: { blockedDomains: ['127.0.0.1'] } })
  const alertId = (await gw.api('POST', '/v1/alerts', { body: { agentId: 'sealer', type: 'policy_violation', notify: { type: 'webhook', url: alertUrl } } })).body.alertId
  t.equal((await gw.api('POST', '/v1/webhooks', { body: { url: endpointUrl, events: ['policy.violation'] } })).status, 201)
  const refused = await gw.api('POST', '/v1/pay', { body: { agentId: 'sealer', endpoint: `${m.url}/paid` } })
  t.equal(refused.status, 402, `a refusal: one event for the alert and the endpoint (${refused.text})`)
  await gw.gw.notify.settle()
  t.same(rx.got.map((r) => r.path).sort(), [`/ep?token=${EP_SECRET}`, `/hook/${TOKEN}?token=${SECRET}`], 'each delivered to its whole URL')
  t.match((await gw.api('GET', `/v1/alerts/${alertId}`)).body.notify.url, /\/hook\/\*\*\*\?token=\*\*\*$/, 'the API shows it masked')
  const listed = JSON.stringify((await gw.api('GET', '/v1/deliveries')).body)
  t.notMatch(listed, SECRET, 'the delivery log shows no token')
  await gw.close({ keepData: true })

  const stored = await storedText(dataDir)
  t.ok(stored.includes(alertId), 'the store holds the alert')
  for (const s of [SECRET, EP_SECRET, TOKEN]) t.notOk(stored.includes(s), `no ${s} anywhere in the store or its log`)

  gw = await startTestGateway({ dataDir })
  t.teardown(() => gw.close())
  t.equal((await gw.api('POST', `/v1/alerts/${alertId}/test`)).status, 202)
  await gw.gw.notify.settle()
  t.equal(rx.got.at(-1)?.path, `/hook/${TOKEN}?token=${SECRET}`, 'after a restart: the whole URL, opened from the store')
})

t.test('alerts and endpoints stored in the clear by an earlier version are sealed at start, and still delivered to', async (t) => {
  const dataDir = testDir(t)
  const rx = await startReceiver(t)
  const alertUrl = `${rx.url}/old/${TOKEN}?token=${SECRET}`
  let gw = await startTestGateway({ dataDir })
  await gw.api('POST', '/v1/agents', { body: { agentId: 'legacy' } })
  await gw.close({ keepData: true })
  // As an earlier version wrote them: the URL as given.
  const store = await Store.open(dataDir)
  const createdAt = new Date().toISOString()
  await store.collection('alerts').put('al_legacy00000000000', { alertId: 'al_legacy00000000000', agentId: 'legacy', type: 'policy_violation', notify: { type: 'webhook', url: alertUrl }, createdAt })
  await store.collection('webhookEndpoints').put('wh_legacy00000000000', { webhookId: 'wh_legacy00000000000', url: `${rx.url}/ep-old?token=${EP_SECRET}`, events: ['alert.test'], createdAt })
  await store.close()
  t.ok((await storedText(dataDir)).includes(SECRET), 'stored in the clear before the start')

  gw = await startTestGateway({ dataDir })
  t.teardown(() => gw.close())
  t.ok(
    gw.logs.some((l) => l.includes('now encrypted') && l.includes('"sealed":2')),
    'the start says it sealed them',
  )
  t.equal((await gw.api('POST', '/v1/alerts/al_legacy00000000000/test')).status, 202)
  await gw.gw.notify.settle()
  t.equal(rx.got.at(-1)?.path, `/old/${TOKEN}?token=${SECRET}`, 'delivered to the whole URL')
  await gw.close({ keepData: true })
  const stored = await storedText(dataDir)
  for (const s of [SECRET, EP_SECRET, TOKEN]) t.notOk(stored.includes(s), `no ${s} left in the store`)
})
