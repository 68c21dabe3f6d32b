import t from 'tap'
import { STORE_BACKENDS, testStore } from '../helpers/gateway.js'

for (const backend of STORE_BACKENDS) {
  t.test(backend, async (t) => {
    const { store } = await testStore(t, 'paygate-store-', backend)
    const coll = store.collection<unknown>('things')

    t.test('concurrent batches land in call order: the last call wins', async (t) => {
      await Promise.all(Array.from({ length: 200 }, (_, i) => store.batch([{ type: 'put', coll, key: 'k', value: i }])))
      t.equal(await coll.get('k'), 199)
    })

    t.test('a latest() value is taken when its batch is handed to the backend, not when it is queued', async (t) => {
      let state = 'old'
      const first = store.batch([{ type: 'put', coll, key: 'other', value: 1 }]) // in flight
      const queued = store.batch([{ type: 'put', coll, key: 'lazy', value: 'captured', latest: () => state }])
      state = 'newest'
      await Promise.all([first, queued])
      t.equal(await coll.get('lazy'), 'newest')
    })

    t.test('a batch that cannot be written fails alone; the batches grouped with it are written', async (t) => {
      const ok1 = store.batch([{ type: 'put', coll, key: 'a', value: 1 }])
      const bad = store.batch([{ type: 'put', coll, key: 'b', value: 2n }])
      const ok2 = store.batch([{ type: 'put', coll, key: 'c', value: 3 }])
      const results = await Promise.allSettled([ok1, bad, ok2])
      t.same(
        results.map((r) => r.status),
        ['fulfilled', 'rejected', 'fulfilled'],
      )
      t.same([await coll.get('a'), await coll.get('b'), await coll.get('c')], [1, undefined, 3])
    })
  })
}
