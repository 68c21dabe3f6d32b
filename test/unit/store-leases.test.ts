import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { Store } from '../../src/store/index.js'
import { CrossLocks } from '../../src/store/leases.js'
import { OffsetClock } from '../../src/util/clock.js'
import { STORE_BACKENDS, testStore } from '../helpers/gateway.js'

for (const backend of STORE_BACKENDS) {
  t.test(`${backend}: a name is held by one holder at a time, across holders sharing the store`, async (t) => {
    const { store, url } = await testStore(t, undefined, backend)
    // On PostgreSQL a second store opened on the same database stands for a second replica.
    const other = url ? await Store.open('/nonexistent-unused', { postgresUrl: url }) : store
    if (url) t.teardown(() => other.close())
    const replicas = [new CrossLocks(store), new CrossLocks(other)]
    t.equal(replicas[0]!.shared, backend === 'postgres', 'rows only on a shared store')
    let inside = 0
    let most = 0
    const order: number[] = []
    await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        replicas[i % 2]!.run('negotiation', async () => {
          inside++
          most = Math.max(most, inside)
          await sleep(5) // a second holder would enter here without the lease
          order.push(i)
          inside--
        }),
      ),
    )
    t.equal(most, 1, 'never two holders at once')
    t.equal(order.length, 12, 'every holder ran once')
    t.equal(await replicas[0]!.run('negotiation', async () => 'free again'), 'free again', 'released after the last holder')
  })
}

t.test('postgres: a holder that stops renewing loses its lease after the TTL; replica leases say who is alive', async (t) => {
  const { store, url } = await testStore(t, undefined, 'postgres')
  const other = await Store.open('/nonexistent-unused', { postgresUrl: url! })
  t.teardown(() => other.close())
  const clock = new OffsetClock()
  const dead = new CrossLocks(store, clock, { ttlMs: 60_000 })
  const live = new CrossLocks(other, clock, { ttlMs: 60_000, maxPollMs: 20 })

  const stopA = dead.holdReplicaLease()
  const stopB = live.holdReplicaLease()
  for (let i = 0; i < 100 && !(await live.alive(dead.replicaId)); i++) await sleep(10)
  t.ok(await live.alive(dead.replicaId), 'a holding replica is alive to the others')
  await stopA()
  t.notOk(await live.alive(dead.replicaId), 'a replica that stopped is not')

  // A holder that never finishes (a killed replica: no release, and its renewals are what stops).
  let entered = false
  void dead.run('fixed-nonce', () => new Promise(() => {}))
  await sleep(50)
  const waiting = live.run('fixed-nonce', async () => {
    entered = true
  })
  await sleep(200)
  t.notOk(entered, 'the lease is respected while it is valid')
  clock.offset += 10 * 60_000 // past its TTL, as if its renewals had stopped long ago
  await waiting
  t.ok(entered, 'taken over once it expired')
  await stopB()
})
