import t from 'tap'
import { Store } from '../../src/store/index.js'
import { MinuteSpend } from '../../src/notify/spend.js'
import { testDir } from '../helpers/gateway.js'

/** Minute buckets on a real store: windows to the minute, pruning past 24 h, the same after a reopen. */
t.test('spend over trailing windows, to the minute, durable', async (t) => {
  const dir = testDir(t)
  let store = await Store.open(dir)
  let spend = new MinuteSpend(store)
  await spend.load()
  const t0 = Date.parse('2026-03-01T10:00:00Z')
  const pay = (at: number, units: bigint) => store.batch(spend.add('a', at, units))
  await pay(t0 + 5_000, 10n)
  await pay(t0 + 50_000, 20n)
  await pay(t0 + 65_000, 40n)
  await pay(t0 + 10 * 60_000, 80n)
  const now = t0 + 10 * 60_000 + 30_000
  t.equal(await spend.spent('a', now - 60_000, now), 80n, '1m: the current minute')
  t.equal(await spend.spent('a', now - 10 * 60_000, now), 120n, '10 min back: the minute at 10:00 started before the window')
  t.equal(await spend.spent('a', now - 11 * 60_000, now), 150n, 'and an hour holds all')
  t.equal(await spend.spent('b', now - 3_600_000, now), 0n)

  await store.close()
  store = await Store.open(dir)
  t.teardown(() => store.close())
  spend = new MinuteSpend(store)
  await spend.load()
  t.equal(await spend.spent('a', now - 3_600_000, now), 150n, 'the same after a reopen')

  const later = t0 + 25 * 3_600_000
  const ops = spend.add('a', later, 1n)
  t.equal(ops.filter((o) => o.type === 'del').length, 3, 'a new minute deletes the buckets past 24 h')
  await store.batch(ops)
  t.equal(await spend.spent('a', later - 86_400_000, later), 1n)
  await store.batch(spend.forget('a'))
  t.equal(await spend.spent('a', later - 86_400_000, later), 0n)
  const left: string[] = []
  for await (const k of store.collection('notifySpend').keys()) left.push(k)
  t.same(left, [], 'nothing left on disk after forget')
})

t.test("asOf: a payment's own minute as it stood right after it, whatever that minute holds now", async (t) => {
  const store = await Store.open(testDir(t))
  t.teardown(() => store.close())
  const spend = new MinuteSpend(store)
  await spend.load()
  const t0 = Date.parse('2026-03-01T10:00:00Z')
  await store.batch(spend.add('a', t0 + 5_000, 10n))
  await store.batch(spend.add('a', t0 + 65_000, 20n))
  const asOf = spend.asOf('a', t0 + 65_000)
  t.same(asOf, { writer: '', minute: t0 + 60_000, units: 20n })
  await store.batch(spend.add('a', t0 + 70_000, 40n)) // later in the same minute
  const now = t0 + 65_000
  t.equal(await spend.spent('a', now - 3_600_000, now), 70n, 'read now: the later payment is in')
  t.equal(await spend.spent('a', now - 3_600_000, now, asOf), 30n, 'as of the payment: its minute as it stood, the minute before as it is')
  t.equal(await spend.spent('a', now - 3_600_000, now, { ...asOf, writer: 'other' }), 70n, "another writer's minute does not replace this one's")
})
