import t, { type Test } from 'tap'
import { Writable } from 'node:stream'
import { createLogger } from '../../src/log/index.js'
import { EgressGuard } from '../../src/net/egress.js'
import { postJson } from '../../src/notify/channels/http.js'
import type { Delivery } from '../../src/notify/model.js'
import { DeliveryQueue, newDeliveryId } from '../../src/notify/queue.js'
import { Store } from '../../src/store/index.js'
import { CrossLocks } from '../../src/store/leases.js'
import { ManualClock } from '../../src/util/clock.js'
import { testDir } from '../helpers/gateway.js'
import { testDatabase } from '../helpers/postgres.js'
import { type Received, startReceiver } from '../helpers/receiver.js'

/**
 * Delivery ownership with replicas on one PostgreSQL database (notify/queue.ts): replicas are
 * queues on their own connections, each with its own replica lease and its own clock (a
 * replica's view of time: its lease rows are written with it, others judge them with theirs).
 * A "killed" replica's lease store is closed, so its lease stops being renewed but is not released.
 */
const log = createLogger(
  'warn',
  new Writable({
    write(_c, _e, cb) {
      cb()
    },
  }),
)
const egress = new EgressGuard({ allow: [], deny: [], log })
const ATTEMPT_MS = 1500
/** What the queue adds to the attempt timeout when it fences an adopted delivery. */
const FENCE_MS = ATTEMPT_MS + 2000

interface Replica {
  id: string
  clock: ManualClock
  store: Store
  queue: DeliveryQueue
  /** Graceful stop: the queue, then the lease released. */
  stop(): Promise<void>
  /** SIGKILL as far as the others can tell: the lease is no longer renewed (nor released). */
  kill(): Promise<void>
}

/** `ttlMs`: its lease's (default 15 s). */
async function replica(t: Test, url: string, ttlMs?: number): Promise<Replica> {
  const clock = new ManualClock()
  const store = await Store.open(testDir(t), { postgresUrl: url })
  // The lease on a connection of its own, so a kill can cut it while the queue (a stalled owner) runs on.
  const leaseStore = await Store.open(testDir(t), { postgresUrl: url })
  const locks = new CrossLocks(leaseStore, clock, ttlMs ? { ttlMs } : {})
  const release = locks.holdReplicaLease()
  const queue = new DeliveryQueue(store, clock, log, (d) => postJson(egress, (d.channel as { url: string }).url, d.body, { 'x-paygate-delivery': d.id }, ATTEMPT_MS), {
    ...{ concurrency: 4, retentionMs: 86_400_000, pollMs: 60_000 },
    // Adoption looks are called by hand here.
    ...{ owners: locks, attemptMs: ATTEMPT_MS, adoptMs: 3_600_000 },
  })
  let closed = false
  const closeAll = async (graceful: boolean) => {
    if (closed) return
    closed = true
    await queue.close()
    if (graceful) await release()
    await leaseStore.close()
    await store.close()
  }
  t.teardown(() => closeAll(true))
  // Wait for the lease row before anything is owned.
  while ((await locks.leaseEnd(locks.replicaId)) === null) await new Promise((r) => setTimeout(r, 10))
  await queue.start()
  return {
    id: locks.replicaId,
    clock,
    store,
    queue,
    stop: () => closeAll(true),
    async kill() {
      await leaseStore.close()
    },
  }
}

/** A new delivery to `url`, due now on `r`'s clock, written by `r` (its owner). `accept`: false as if killed between the write and the hand-over. */
async function enqueue(r: Replica, url: string, accept = true): Promise<Delivery> {
  const now = r.clock.now()
  const d: Delivery = {
    ...{ id: newDeliveryId(now), event: 'policy.violation', agentId: 'a', alertId: 'al_x', webhookId: null, channel: { type: 'webhook', url } },
    ...{ body: '{"event":"policy.violation"}', status: 'pending', attempts: [], nextAt: now, createdAt: now, updatedAt: now },
  }
  await r.store.batch(r.queue.ops([d]))
  if (accept) r.queue.accept([d])
  return d
}

const ids = (rx: { got: Received[] }, id: string): Received[] => rx.got.filter((g) => g.headers['x-paygate-delivery'] === id)

t.test('only the owner attempts a delivery while its lease lives', async (t) => {
  const url = await testDatabase()
  const rx = await startReceiver(t)
  rx.setMode('fail')
  // A's lease lasts 10 min, so B can move its clock past A's retry while A still looks alive.
  const a = await replica(t, url, 600_000)
  const b = await replica(t, url)
  const d = await enqueue(a, `${rx.url}/own`)
  await a.queue.settle()
  t.equal(rx.got.length, 1, "the owner's first attempt")
  t.same((await b.queue.get(d.id)).owner, a.id, 'stamped with its owner')

  // B looks (and its clock is past the retry too): A lives, so B leaves it alone.
  b.clock.advance(61_000)
  t.equal(await b.queue.adopt(), 0, 'not adopted while the owner lives')
  await b.queue.settle()
  t.equal(b.queue.depth(), 0)
  t.equal(rx.got.length, 1, 'B did not attempt it')

  a.clock.advance(61_000)
  await a.queue.settle()
  const s = await b.queue.get(d.id)
  t.equal(rx.got.length, 2, "the owner's retry, on its schedule")
  t.same(
    s.attempts.map((x) => x.by),
    [a.id, a.id],
    'every attempt by the owner',
  )
})

t.test('a stopped replica (lease released): each of its deliveries is adopted at once by exactly one replica, and delivered once', async (t) => {
  const url = await testDatabase()
  const rx = await startReceiver(t)
  rx.setMode('fail')
  const [a, b, c] = [await replica(t, url), await replica(t, url), await replica(t, url)]
  const ds = []
  for (let i = 0; i < 6; i++) ds.push(await enqueue(a, `${rx.url}/stop/${i}`))
  await a.queue.settle()
  t.equal(rx.got.length, 6, 'each attempted once by A (and failed: retrying)')
  await a.stop()

  // B and C look at the same time: every delivery goes to one of them.
  const [nb, nc] = await Promise.all([b.queue.adopt(), c.queue.adopt()])
  t.equal(nb + nc, 6, `all six adopted (B ${nb}, C ${nc})`)
  t.equal(b.queue.depth() + c.queue.depth(), 6, 'each held by one replica')
  t.same([await b.queue.adopt(), await c.queue.adopt()], [0, 0], 'a second look adopts nothing')

  rx.setMode('ok')
  b.clock.advance(61_000)
  c.clock.advance(61_000)
  await Promise.all([b.queue.settle(), c.queue.settle()])
  for (const d of ds) {
    const s = await b.queue.get(d.id)
    t.equal(s.status, 'delivered', `${d.id} delivered`)
    t.equal(ids(rx, d.id).filter((g) => g.answered === 200).length, 1, 'answered 2xx once')
    t.equal(ids(rx, d.id).length, 2, "A's failed attempt and the adopter's: no third")
    t.ok([b.id, c.id].includes(s.owner!) && s.attempts[1]!.by === s.owner, 'attempted by its new owner')
  }
})

t.test('a killed replica (lease expired): left alone until its lease ends, then adopted, and first attempted once an attempt of its could have ended', async (t) => {
  const url = await testDatabase()
  const rx = await startReceiver(t)
  const [a, b] = [await replica(t, url), await replica(t, url)]
  // Killed between writing the delivery and attempting it.
  const d = await enqueue(a, `${rx.url}/kill`, false)
  await a.kill()
  await a.queue.close()

  t.equal(await b.queue.adopt(), 0, 'within the lease: not adopted')
  b.clock.advance(16_000) // past the 15 s lease, on B's clock
  t.equal(await b.queue.adopt(), 1, 'adopted once the lease ended')
  await b.queue.settle()
  t.equal(rx.got.length, 0, 'not attempted yet: the fence')
  b.clock.advance(FENCE_MS)
  await b.queue.settle()
  t.equal(ids(rx, d.id).length, 1, 'attempted once')
  const s = await b.queue.get(d.id)
  t.same([s.status, s.owner, s.attempts.length], ['delivered', b.id, 1])
})

t.test('an owner that stalled past its lease: its attempt in flight when adopted is not written, and it attempts no more', async (t) => {
  const url = await testDatabase()
  const rx = await startReceiver(t)
  rx.setMode('hang')
  const [a, b] = [await replica(t, url), await replica(t, url)]
  const d = await enqueue(a, `${rx.url}/stall`)
  await rx.waitFor(1)
  t.equal(rx.got.length, 1, "A's attempt is in flight (the receiver holds it)")
  await a.kill() // A's lease is no longer renewed, but A runs on
  b.clock.advance(16_000)
  t.equal(await b.queue.adopt(), 1, 'B adopts it')
  await a.queue.settle() // A's attempt times out (ATTEMPT_MS): its result finds B the owner
  const mid = await b.queue.get(d.id)
  t.same([mid.owner, mid.attempts.length, mid.status], [b.id, 0, 'pending'], "A's failed attempt was not written over B's ownership")
  t.equal(a.queue.depth(), 0, 'A dropped it')

  rx.setMode('ok')
  a.clock.advance(3_600_000)
  await a.queue.settle()
  t.equal(rx.got.length, 1, 'A does not attempt it again')
  await b.queue.settle()
  t.equal(rx.got.length, 1, "B waits for the fence (A's attempt could still be running)")
  b.clock.advance(FENCE_MS)
  await b.queue.settle()
  const s = await b.queue.get(d.id)
  t.same([s.status, s.attempts.map((x) => x.by)], ['delivered', [b.id]])
  t.equal(rx.got.filter((g) => g.answered === 200).length, 1, 'delivered once')
})

t.test('a manual retry of a dropped delivery through two replicas at once: one owns it, the other is refused', async (t) => {
  const url = await testDatabase()
  const rx = await startReceiver(t)
  const [a, b] = [await replica(t, url), await replica(t, url)]
  const d = await enqueue(a, `${rx.url}/retry`, false)
  // Dropped (as after its last retry), then retried through both.
  await a.store.batch(a.queue.ops([{ ...d, status: 'dropped', nextAt: null }]).slice(0, 1))
  await a.store.batch([{ type: 'del', coll: a.queue.dueColl as never, key: d.id }])
  const r = await Promise.allSettled([a.queue.retry(d.id), b.queue.retry(d.id)])
  t.equal(r.filter((x) => x.status === 'fulfilled').length, 1, 'one retry taken')
  t.match((r.find((x) => x.status === 'rejected') as PromiseRejectedResult).reason, { code: 'conflict' }, 'the other: 409')
  await Promise.all([a.queue.settle(), b.queue.settle()])
  t.equal(ids(rx, d.id).length, 1, 'sent once')
  t.equal((await a.queue.get(d.id)).status, 'delivered')
})

t.test('an owner that stalled past its lease with a delivery retrying: once adopted, it does not attempt it when it comes due', async (t) => {
  const url = await testDatabase()
  const rx = await startReceiver(t)
  rx.setMode('fail')
  const [a, b] = [await replica(t, url), await replica(t, url)]
  const d = await enqueue(a, `${rx.url}/due`)
  await a.queue.settle()
  t.equal(rx.got.length, 1, "A's first attempt failed: retrying in 1 min")
  await a.kill() // A's lease is no longer renewed, but A runs on, the delivery in its schedule
  b.clock.advance(16_000)
  t.equal(await b.queue.adopt(), 1, 'B adopts it')
  rx.setMode('ok')
  a.clock.advance(61_000)
  await a.queue.settle()
  t.equal(rx.got.length, 1, 'A, on its schedule, finds it is no longer its own: no attempt')
  t.equal(a.queue.depth(), 0)
  b.clock.advance(61_000)
  await b.queue.settle()
  const s = await b.queue.get(d.id)
  t.same([s.status, s.attempts.map((x) => x.by)], ['delivered', [a.id, b.id]])
  t.equal(rx.got.length, 2, 'one more attempt, by B')
})
