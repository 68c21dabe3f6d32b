import t from 'tap'
import { testStore } from '../helpers/gateway.js'

t.test('transact: read-modify-writes of one key never interleave, and land in order', async (t) => {
  const { store } = await testStore(t)
  const counters = store.collection<number>('counters')
  const seen: number[] = []
  const runs = Array.from({ length: 50 }, async () => {
    const { result, written } = await store.transact('c', async () => {
      const n = (await counters.get('c')) ?? 0
      await new Promise((r) => setImmediate(r)) // another transact would interleave here without the lock
      return { ops: [{ type: 'put' as const, coll: counters, key: 'c', value: n + 1 }], result: n + 1 }
    })
    seen.push(result)
    return written
  })
  const written = await Promise.all(runs)
  t.ok(
    written.every((w) => w.ok),
    'every batch written',
  )
  t.equal(await counters.get('c'), 50, 'no lost update')
  t.same(
    [...seen].sort((a, b) => a - b),
    Array.from({ length: 50 }, (_, i) => i + 1),
    'each saw the one before it',
  )
})

t.test('transact: a failing function writes nothing and frees the key', async (t) => {
  const { store } = await testStore(t)
  const c = store.collection<number>('counters')
  await t.rejects(
    store.transact('k', async () => Promise.reject(new Error('no'))),
    /no/,
  )
  const { written } = await store.transact('k', async () => ({ ops: [{ type: 'put' as const, coll: c, key: 'k', value: 1 }], result: null }))
  t.ok((await written).ok)
  t.equal(await c.get('k'), 1)
})
