import t from 'tap'
import { Writable } from 'node:stream'
import { createLogger } from '../../src/log/index.js'
import { EgressGuard } from '../../src/net/egress.js'
import { postJson } from '../../src/notify/channels/http.js'
import type { Delivery } from '../../src/notify/model.js'
import { DeliveryQueue, newDeliveryId } from '../../src/notify/queue.js'
import { RETRY_DELAYS_MS } from '../../src/notify/schedule.js'
import { Store } from '../../src/store/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { testDir } from '../helpers/gateway.js'
import { startReceiver } from '../helpers/receiver.js'

/**
 * The retry schedule on a real store and a real receiver, with the clock moved by hand:
 * attempts at 0, +1 min, +5 min, +30 min, +2 h after each failure, then dropped; a restart
 * mid-schedule picks the schedule up from the store; a dropped delivery can be sent again.
 */
const logs: string[] = []
const log = createLogger(
  'info',
  new Writable({
    write(c, _e, cb) {
      logs.push(String(c))
      cb()
    },
  }),
)

t.test('1 m, 5 m, 30 m, 2 h, dropped; a restart mid-schedule keeps it; retry sends a dropped one again', async (t) => {
  const dir = testDir(t)
  const rx = await startReceiver(t)
  rx.setMode('fail')
  const clock = new ManualClock()
  const egress = new EgressGuard({ allow: [], deny: [], log })
  const open = async () => {
    const store = await Store.open(dir)
    const queue = new DeliveryQueue(store, clock, log, (d) => postJson(egress, (d.channel as { url: string }).url, d.body, { 'x-paygate-delivery': d.id }, 5000), {
      concurrency: 2,
      retentionMs: 7 * 86_400_000,
      pollMs: 60_000,
    })
    await queue.start()
    return { store, queue }
  }
  let { store, queue } = await open()
  const now = clock.now()
  const d: Delivery = {
    ...{ id: newDeliveryId(now), event: 'policy.violation', agentId: 'a', alertId: 'al_x', webhookId: null, channel: { type: 'webhook', url: `${rx.url}/r` } },
    ...{ body: '{"event":"policy.violation"}', status: 'pending', attempts: [], nextAt: now, createdAt: now, updatedAt: now },
  }
  await store.batch(queue.ops([d]))
  queue.accept([d])
  await queue.settle()
  t.equal(rx.got.length, 1, 'first attempt at once')
  const state = async () => (await queue.get(d.id)) as Delivery

  for (const [i, delay] of RETRY_DELAYS_MS.entries()) {
    const s = await state()
    t.same([s.status, s.nextAt! - s.attempts.at(-1)!.at], ['retrying', delay], `after failure ${i + 1}: next in ${delay / 60_000} min`)
    clock.advance(delay - 1)
    await queue.settle()
    t.equal(rx.got.length, i + 1, 'not a millisecond early')
    if (i === 1) {
      // Restart mid-schedule: the schedule is in the store.
      queue.close()
      await store.close()
      ;({ store, queue } = await open())
      t.equal(queue.depth(), 1, 'the delivery is waiting again after the restart')
      t.equal((await state()).attempts.length, 2)
    }
    clock.advance(1)
    await queue.settle()
    t.equal(rx.got.length, i + 2, `retry ${i + 1} on time`)
  }
  const dropped = await state()
  t.match(dropped, { status: 'dropped', nextAt: null })
  t.equal(dropped.attempts.length, 5)
  t.ok(
    dropped.attempts.every((a) => a.status === 500),
    'every attempt recorded with its status',
  )
  t.equal(queue.depth(), 0)
  t.ok(
    logs.some((l) => l.includes('notification dropped after its last retry')),
    'the drop is logged',
  )
  t.equal(new Set(rx.got.map((r) => r.headers['x-paygate-delivery'])).size, 1, 'one delivery id on every attempt')
  t.equal(new Set(rx.got.map((r) => r.raw.toString('hex'))).size, 1, 'the same body bytes on every attempt')

  clock.advance(10 * 3_600_000)
  await queue.settle()
  t.equal(rx.got.length, 5, 'nothing more once dropped')
  rx.setMode('ok')
  const again = await queue.retry(d.id)
  t.equal(again.status, 'pending')
  await queue.settle()
  t.match(await state(), { status: 'delivered' })
  t.equal(rx.got.length, 6)
  await t.rejects(queue.retry(d.id), { code: 'conflict' }, 'a delivered one is not retried')

  // Retention: kept for its time, then swept.
  clock.advance(7 * 86_400_000 - 1)
  t.equal(await queue.sweep(), 0)
  clock.advance(2)
  t.equal(await queue.sweep(), 1)
  await t.rejects(queue.get(d.id), { code: 'not_found' })
  queue.close()
  await store.close()
})

t.test("bounded concurrency, and the guard's always-denied list applies to notification targets", async (t) => {
  const dir = testDir(t)
  const store = await Store.open(dir)
  t.teardown(() => store.close())
  const clock = new ManualClock()
  const egress = new EgressGuard({ allow: [], deny: [], log })
  const rx = await startReceiver(t)
  rx.setMode('hang')
  egress.protect(4242)
  let inFlight = 0
  let most = 0
  const queue = new DeliveryQueue(
    store,
    clock,
    log,
    async (d) => {
      inFlight++
      most = Math.max(most, inFlight)
      const r = await postJson(egress, (d.channel as { url: string }).url, d.body, {}, 1000)
      inFlight--
      return r
    },
    { concurrency: 3, retentionMs: 86_400_000 },
  )
  await queue.start()
  t.teardown(() => queue.close())
  const now = clock.now()
  const mk = (url: string): Delivery => ({
    id: newDeliveryId(now),
    event: 'alert.test',
    agentId: 'a',
    alertId: null,
    webhookId: null,
    channel: { type: 'webhook', url },
    body: '{}',
    status: 'pending',
    attempts: [],
    nextAt: now,
    createdAt: now,
    updatedAt: now,
  })
  const ds = [...Array.from({ length: 8 }, () => mk(`${rx.url}/h`)), mk('http://169.254.169.254/latest'), mk('http://127.0.0.1:4242/own')]
  await store.batch(queue.ops(ds))
  queue.accept(ds)
  await queue.settle()
  t.equal(most, 3, 'never more than notify.concurrency attempts at once')
  const meta = await queue.get(ds[8]!.id)
  t.match(meta.attempts[0], { status: null, error: /metadata|link-local/ })
  t.match((await queue.get(ds[9]!.id)).attempts[0], { status: null, error: /own listeners/ })
  t.match((await queue.get(ds[0]!.id)).attempts[0], { status: null, error: 'no answer within 1000 ms' })
  t.equal(rx.got.length, 8, 'a private (loopback) operator target is allowed')
})

t.test('a receiver that hangs holds at most a few slots: another destination is delivered while it hangs', async (t) => {
  const dir = testDir(t)
  const store = await Store.open(dir)
  t.teardown(() => store.close())
  const clock = new ManualClock()
  const egress = new EgressGuard({ allow: [], deny: [], log })
  const dead = await startReceiver(t)
  dead.setMode('hang')
  const live = await startReceiver(t)
  // Attempts that would hang far longer than this test waits: only the per-destination limit lets the other delivery through.
  const queue = new DeliveryQueue(store, clock, log, (d) => postJson(egress, (d.channel as { url: string }).url, d.body, {}, 60_000), { concurrency: 8, retentionMs: 86_400_000 })
  await queue.start()
  t.teardown(() => queue.close())
  const mk = (url: string, at: number): Delivery => ({
    ...{ id: newDeliveryId(at), event: 'alert.test', agentId: 'a', alertId: null, webhookId: null, channel: { type: 'webhook', url } },
    ...{ body: '{}', status: 'pending', attempts: [], nextAt: at, createdAt: at, updatedAt: at },
  })
  const now = clock.now()
  const jam = Array.from({ length: 40 }, (_, i) => mk(`${dead.url}/hang/${i}`, now))
  await store.batch(queue.ops(jam))
  queue.accept(jam)
  await dead.waitFor(2, 5_000)
  // Younger than the whole jam, so it only goes first because the dead destination is full.
  const other = mk(`${live.url}/ok`, now + 1)
  clock.advance(1)
  await store.batch(queue.ops([other]))
  queue.accept([other])
  t.equal((await live.waitFor(1, 5_000)).length, 1, "the other destination's delivery arrived")
  t.ok(
    dead.got.every((r) => r.answered === null),
    'while every attempt at the dead destination is still hanging',
  )
  t.ok(dead.got.length <= 2, `the dead destination holds at most 2 slots (${dead.got.length} attempts in flight)`)
  for (let i = 0; i < 100 && (await queue.get(other.id)).status !== 'delivered'; i++) await new Promise((r) => setTimeout(r, 20))
  t.match(await queue.get(other.id), { status: 'delivered' }, 'and is written as delivered')
})

t.test('a delivery whose alert is gone by its next attempt is dropped with the reason, not sent', async (t) => {
  const dir = testDir(t)
  const store = await Store.open(dir)
  t.teardown(() => store.close())
  const clock = new ManualClock()
  const egress = new EgressGuard({ allow: [], deny: [], log })
  const rx = await startReceiver(t)
  const gone = new Set<string>()
  const queue = new DeliveryQueue(store, clock, log, (d) => postJson(egress, (d.channel as { url: string }).url, d.body, {}, 5000), {
    ...{ concurrency: 2, retentionMs: 86_400_000 },
    cancelled: async (d) => (d.alertId && gone.has(d.alertId) ? 'alert_deleted' : null),
  })
  await queue.start()
  t.teardown(() => queue.close())
  const now = clock.now()
  const mk = (alertId: string): Delivery => ({
    ...{ id: newDeliveryId(now), event: 'alert.test', agentId: 'a', alertId, webhookId: null, channel: { type: 'webhook', url: `${rx.url}/${alertId}` } },
    ...{ body: '{}', status: 'pending', attempts: [], nextAt: now, createdAt: now, updatedAt: now },
  })
  const [kept, dropped] = [mk('al_kept'), mk('al_gone')]
  gone.add('al_gone')
  await store.batch(queue.ops([kept, dropped]))
  queue.accept([kept, dropped])
  await queue.settle()
  t.same(
    rx.got.map((r) => r.path),
    ['/al_kept'],
    'only the live alert is sent',
  )
  t.match(await queue.get(dropped.id), { status: 'dropped', dropReason: 'alert_deleted', nextAt: null, attempts: [] })
  t.equal(queue.depth(), 0)
  await t.rejects(queue.retry(dropped.id), { code: 'conflict' }, 'not sent again by hand')
})
