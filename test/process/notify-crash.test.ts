import t from 'tap'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { testDir } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { call, spawnGateway } from '../helpers/process.js'
import { startReceiver } from '../helpers/receiver.js'

t.test('SIGKILL between a rejection and its delivery: after restart it is delivered at least once, under one delivery id', async (t) => {
  const dataDir = testDir(t)
  const rx = await startReceiver(t)
  rx.setMode('hang')
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => first.stop('SIGKILL'))
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const info = (await call(first.url, 'GET', '/v1/chain', acct)).body
  const m = await startV2Merchant({
    chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token },
    facilitatorKey: generatePrivateKey(),
    payTo: privateKeyToAccount(generatePrivateKey()).address,
    price: 1000n,
  })
  t.teardown(() => m.close())
  await call(first.url, 'POST', '/v1/agents', acct, { agentId: 'kill' })
  await call(first.url, 'PUT', '/v1/policies/kill', acct, { blockedDomains: ['127.0.0.1'] })
  const alert = await call(first.url, 'POST', '/v1/alerts', acct, { agentId: 'kill', type: 'policy_violation', notify: { type: 'webhook', url: `${rx.url}/kill` } })
  t.equal(alert.status, 201, alert.text)

  const refused = await call(first.url, 'POST', '/v1/pay', acct, { agentId: 'kill', endpoint: `${m.url}/paid` })
  t.same([refused.status, refused.body.reason], [402, 'domain_blocked'])
  // Its delivery is in flight (the receiver holds it unanswered) ...
  await rx.waitFor(1, 60_000)
  t.equal(rx.got.length, 1, 'the first attempt reached the receiver')
  // ... and a second rejection is refused right before the kill, its delivery wherever it got to.
  const second = await call(first.url, 'POST', '/v1/pay', acct, { agentId: 'kill', endpoint: `${m.url}/paid` })
  t.equal(second.status, 402)
  t.equal(await first.stop('SIGKILL'), 'SIGKILL')

  rx.setMode('ok')
  const next = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => next.stop('SIGKILL'))
  const end = Date.now() + 60_000
  let delivered: any[] = []
  while (Date.now() < end) {
    delivered = (await call(next.url, 'GET', `/v1/deliveries?alertId=${alert.body.alertId}`, acct)).body.deliveries
    if (delivered.length === 2 && delivered.every((d) => d.status === 'delivered')) break
    await new Promise((r) => setTimeout(r, 100))
  }
  t.equal(delivered.length, 2, 'one delivery per rejection')
  t.ok(
    delivered.every((d) => d.status === 'delivered'),
    'both delivered after the restart',
  )
  const ids = new Set(rx.got.map((r) => r.headers['x-paygate-delivery']))
  t.same([...ids].sort(), delivered.map((d) => d.deliveryId).sort(), 'every request carried one of the two delivery ids')
  for (const id of ids) {
    const bodies = new Set(rx.got.filter((r) => r.headers['x-paygate-delivery'] === id).map((r) => r.raw.toString('hex')))
    t.equal(bodies.size, 1, `${id}: the same bytes on every attempt`)
  }
  const first2xx = rx.got.filter((r) => r.answered === 200).map((r) => r.headers['x-paygate-delivery'])
  t.same(new Set(first2xx), ids, 'each rejection answered 2xx at least once')
  t.ok(
    rx.got.every((r) => r.body.event === 'policy.violation' && r.body.reason === 'domain_blocked'),
    'the payloads',
  )
})
