import t from 'tap'
import pg from 'pg'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { replicaChain, spawnReplicas } from '../helpers/replica-chain.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { call, type GatewayProcess } from '../helpers/process.js'
import { startReceiver } from '../helpers/receiver.js'

// Three gateways, a chain and a 60 s retry on a 2-core machine shared with other tests.
t.setTimeout(600_000)

const CHAIN_ID = 31339
const MASTER_KEY = 'ab'.repeat(32)

/**
 * Alert deliveries with three gateway processes on one PostgreSQL database: a delivery is
 * attempted by the replica that made it; a replica SIGKILLed with one delivery in flight and
 * one retrying has both delivered once by one survivor after its lease; a fire is delivered
 * once, not once per replica.
 */
t.test('alert deliveries across three replicas: owned, adopted once after a SIGKILL, never sent per replica', async (t) => {
  const { anvil, addrs, url, env: shared } = await replicaChain(t, CHAIN_ID)
  const env = {
    ...shared,
    PAYGATE_MASTER_KEY: MASTER_KEY,
    // An attempt that hangs fails after 3 s (and fences an adopter for that long).
    PAYGATE_NOTIFY_TIMEOUT_MS: '3000',
  }
  const { replicas, acct } = await spawnReplicas(t, env, 3, false)
  const [a, b, c] = replicas as [GatewayProcess, GatewayProcess, GatewayProcess]
  const db = new pg.Client({ connectionString: url })
  await db.connect()
  t.teardown(() => db.end())
  /** The stored delivery, as the replicas wrote it (owner and who made each attempt are not in the API). */
  const stored = async (id: string) => {
    const r = await db.query<{ value: string }>(`SELECT value FROM paygate_state WHERE coll = 'notifyDeliveries' AND key = $1`, [Buffer.from(id)])
    return JSON.parse(r.rows[0]!.value) as { owner: string; status: string; attempts: { status: number | null; by: string }[] }
  }

  const rx = await startReceiver(t)
  const m = await startV2Merchant({
    chain: { rpcUrl: anvil.url, chainId: CHAIN_ID, token: addrs.token },
    facilitatorKey: generatePrivateKey(),
    payTo: privateKeyToAccount(generatePrivateKey()).address,
    price: 1000n,
  })
  t.teardown(() => m.close())
  t.equal((await call(a.url, 'POST', '/v1/agents', acct, { agentId: 'v' })).status, 201)
  t.equal((await call(a.url, 'PUT', '/v1/policies/v', acct, { blockedDomains: ['127.0.0.1'] })).status, 200)
  const alert = await call(a.url, 'POST', '/v1/alerts', acct, { agentId: 'v', type: 'policy_violation', notify: { type: 'webhook', url: `${rx.url}/v` } })
  t.equal(alert.status, 201, alert.text)
  const alertId = alert.body.alertId as string
  // Each replica's alert book reloads every 2 s: wait (bounded) until B and C know the alert.
  for (const g of [b, c]) {
    let seen = 0
    for (let i = 0; i < 200 && seen !== 200; i++) {
      seen = (await call(g.url, 'GET', `/v1/alerts/${alertId}`, acct)).status
      if (seen !== 200) await new Promise((r) => setTimeout(r, 50))
    }
    t.equal(seen, 200, 'the alert made through A is known to the other replicas')
  }
  const refuse = async (g: GatewayProcess) => {
    const r = await call(g.url, 'POST', '/v1/pay', acct, { agentId: 'v', endpoint: `${m.url}/paid` })
    t.same([r.status, r.body.reason], [402, 'domain_blocked'])
    return r.body.transactionId as string | undefined
  }
  const deliveries = async (g: GatewayProcess) => (await call(g.url, 'GET', `/v1/deliveries?alertId=${alertId}`, acct)).body.deliveries as { deliveryId: string; status: string }[]
  /** Bounded: until `n` deliveries exist and every one is delivered. */
  const allDelivered = async (g: GatewayProcess, n: number, ms: number) => {
    const end = Date.now() + ms
    let ds = await deliveries(g)
    while (!(ds.length === n && ds.every((d) => d.status === 'delivered')) && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 200))
      ds = await deliveries(g)
    }
    return ds
  }
  const requestsFor = (id: string) => rx.got.filter((g) => g.headers['x-paygate-delivery'] === id)

  // 1. A fire through B: one delivery, attempted by B, received once.
  await refuse(b)
  const [first] = await allDelivered(c, 1, 30_000)
  t.equal(first?.status, 'delivered', 'delivered (read through C)')
  const firstId = first!.deliveryId
  const s1 = await stored(firstId)
  t.equal(s1.attempts.length, 1, 'one attempt')
  t.equal(s1.attempts[0]!.by, s1.owner, 'by its owner')

  // 2. A with one delivery retrying (the receiver failed it) and one in flight (the receiver holds it), then SIGKILLed.
  rx.setMode('fail')
  await refuse(a)
  await rx.waitFor(2, 30_000)
  t.equal(rx.got.at(-1)?.answered, 500, "A's first delivery failed: retrying, next attempt in 1 min")
  rx.setMode('hang')
  await refuse(a)
  await rx.waitFor(3, 30_000)
  t.equal(rx.got.length, 3, "A's second delivery is in flight")
  // Ids sort by creation: the retrying one first.
  const aIds = (await deliveries(b))
    .map((d) => d.deliveryId)
    .filter((id) => id !== firstId)
    .sort()
  t.equal(aIds.length, 2, "A's two deliveries")
  const aOwner = (await stored(aIds[0]!)).owner
  t.equal((await stored(aIds[1]!)).owner, aOwner, 'both owned by A')
  t.equal(await a.stop('SIGKILL'), 'SIGKILL')
  rx.setMode('ok')

  // Adopted after A's lease (15 s) and the fence (3 s + 2 s); the retrying one is attempted when due (1 min after its failure).
  const ds = await allDelivered(b, 3, 150_000)
  t.ok(ds.length === 3 && ds.every((d) => d.status === 'delivered'), 'all three delivered')
  for (const id of aIds) {
    const s = await stored(id)
    t.not(s.owner, aOwner, `${id}: owned by a survivor`)
    t.ok(
      s.attempts.filter((x) => x.by !== aOwner).every((x) => x.by === s.owner),
      'every attempt after the kill by its one adopter',
    )
    t.equal(requestsFor(id).filter((r) => r.answered === 200).length, 1, `${id}: received 2xx exactly once`)
    const adoptions = [b, c].filter((g) => g.stdout.some((l) => l.includes('adopted a delivery of a stopped replica') && l.includes(id)))
    t.equal(adoptions.length, 1, 'adopted by exactly one survivor')
  }
  t.equal(requestsFor(aIds[0]!).length, 2, 'the retrying one: the failed attempt and one after the kill')
  t.equal(requestsFor(aIds[1]!).length, 2, 'the one in flight: the unanswered attempt and one after the kill')

  // 3. Another fire through C while B looks on; and nothing of the first was sent again by anyone.
  await refuse(c)
  const all = await allDelivered(b, 4, 30_000)
  t.equal(all.length, 4)
  const last = all.find((d) => ![firstId, ...aIds].includes(d.deliveryId))!
  t.equal(last.status, 'delivered')
  t.equal(requestsFor(last.deliveryId).length, 1, 'a fire through C: received once')
  t.equal(requestsFor(firstId).length, 1, 'the fire through B still received once')
  t.equal(rx.got.length, 6, 'six requests in all (two of them the attempts A did not finish)')
})
