import t, { type Test } from 'tap'
import { MinuteSpend } from '../../src/notify/spend.js'
import { Store } from '../../src/store/index.js'
import { testDir, testStore } from '../helpers/gateway.js'

/**
 * spend_rate's minute buckets with two replicas on one PostgreSQL database: each writes its own
 * buckets, so payments in one minute through both are all counted, by either.
 */
/** Two replicas' stores on one database, each with its own buckets. */
async function twoReplicas(t: Test) {
  const { store: sa, url } = await testStore(t, undefined, 'postgres')
  const sb = await Store.open(testDir(t), { postgresUrl: url! })
  t.teardown(() => sb.close())
  const a = new MinuteSpend(sa)
  const b = new MinuteSpend(sb)
  await Promise.all([a.load(), b.load()])
  return { sa, sb, a, b, url: url! }
}

t.test("two replicas' payments in the same minutes are summed by either", async (t) => {
  const { sa, sb, a, b, url } = await twoReplicas(t)
  const t0 = Date.parse('2026-03-01T10:00:00Z')
  await sa.batch(a.add('x', t0 + 5_000, 10n))
  await sb.batch(b.add('x', t0 + 6_000, 20n))
  await sa.batch(a.add('x', t0 + 7_000, 40n))
  await sb.batch(b.add('x', t0 + 65_000, 80n))
  await sb.batch(b.add('y', t0 + 65_000, 1000n))
  const now = t0 + 90_000
  t.equal(await a.spent('x', now - 60_000, now), 80n, '1m: the current minute (B only)')
  t.equal(await b.spent('x', now - 120_000, now), 150n, 'both minutes, both writers, read through B')
  t.equal(await a.spent('x', now - 120_000, now), 150n, 'and through A')
  t.equal(await a.spent('x', t0, t0 + 60_000), 80n, 'a bucket on the window start is out, on its end in')

  // A third process (a restarted replica) reads what both wrote.
  const sc = await Store.open(testDir(t), { postgresUrl: url! })
  t.teardown(() => sc.close())
  const c = new MinuteSpend(sc)
  await c.load()
  t.equal(await c.spent('x', now - 3_600_000, now), 150n, 'a new process sums every writer')

  // Past 24 h: swept whoever wrote them; an agent's delete takes every writer's buckets.
  t.equal(await c.sweep(t0 + 25 * 3_600_000), 4, "every writer's buckets past 24 h")
  await sa.batch(a.add('x', t0 + 25 * 3_600_000, 1n))
  await sb.batch(b.add('x', t0 + 25 * 3_600_000, 2n))
  await sa.batch(await c.forgetAll('x'))
  const left: string[] = []
  for await (const k of sa.collection('notifySpend').keys()) left.push(k)
  t.same(left, [], "nothing of x's left, from either writer")
})

t.test("asOf with replicas: only the recording writer's bucket of the payment's minute is taken as it stood", async (t) => {
  const { sa, sb, a, b } = await twoReplicas(t)
  const t0 = Date.parse('2026-03-01T10:00:00Z')
  await sa.batch(a.add('x', t0 + 5_000, 10n))
  const asOf = a.asOf('x', t0 + 5_000)
  t.equal(asOf.units, 10n)
  await sa.batch(a.add('x', t0 + 6_000, 20n)) // later, through the same replica
  await sb.batch(b.add('x', t0 + 7_000, 40n)) // and through the other
  const now = t0 + 5_000
  t.equal(await b.spent('x', now - 60_000, now), 70n, 'read now: every later payment of the minute')
  t.equal(await b.spent('x', now - 60_000, now, asOf), 50n, "as of A's payment: A's bucket as it stood, B's as it is (read through B)")
})
