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

    t.test('logged() runs once its batch is written, before the batch resolves, in call order; never for a batch that fails', async (t) => {
      const seen: string[] = []
      const put = (key: string, value: unknown) => ({ type: 'put' as const, coll, key, value, logged: () => void seen.push(key) })
      const a = store.batch([put('la', 1)]).then(() => void seen.push('a written'))
      const bad = store.batch([put('lb', 2n)]) // cannot be encoded
      const c = store.batch([put('lc', 3), { type: 'del', coll, key: 'la' }, put('ld', 4)]).then(() => void seen.push('c written'))
      const results = await Promise.allSettled([a, bad, c])
      t.same(
        results.map((r) => r.status),
        ['fulfilled', 'rejected', 'fulfilled'],
      )
      t.same(
        seen.filter((s) => s.startsWith('l')),
        ['la', 'lc', 'ld'],
        'in call order, not for the batch that failed',
      )
      t.ok(seen.indexOf('la') < seen.indexOf('a written') && seen.indexOf('ld') < seen.indexOf('c written'), 'each before its batch resolves')
      const { written } = await store.transact('logged-key', async () => ({ ops: [put('lt', 5)], result: null }))
      t.ok((await written).ok)
      t.equal(seen[seen.length - 1], 'lt', "a transact() section's batch too")
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

    t.test('300 concurrent gets over three collections, some missing, some of one key, each answer their own entry', async (t) => {
      const colls = ['r1', 'r2', 'r3'].map((n) => store.collection<{ n: string }>(n))
      await store.batch(colls.flatMap((c) => Array.from({ length: 50 }, (_, i) => ({ type: 'put' as const, coll: c, key: `k${i}\u0000x`, value: { n: `${c.name}/${i}` } }))))
      const statements = countStatements(store)
      // Keys 0..99 of each: 0..49 exist, 50..99 do not; every fifth read asks for key 0 again.
      const want = Array.from({ length: 300 }, (_, i) => ({ c: colls[i % 3]!, k: i % 5 === 4 ? 0 : Math.floor(i / 3) }))
      const got = await Promise.all(want.map((w) => w.c.get(`k${w.k}\u0000x`)))
      t.same(
        got,
        want.map((w) => (w.k < 50 ? { n: `${w.c.name}/${w.k}` } : undefined)),
      )
      // On PostgreSQL, reads beyond the few in flight go together: far fewer statements than reads.
      if (statements) t.ok(statements() < 100, `300 reads in ${statements()} statements`)
    })
  })
}

/** On PostgreSQL, a count of the statements the store sends from now on; undefined on LevelDB. */
function countStatements(store: object): (() => number) | undefined {
  const s = store as { backend?: string; query?: (...a: unknown[]) => Promise<unknown> }
  if (s.backend !== 'postgres' || !s.query) return undefined
  let n = 0
  const query = s.query.bind(store)
  s.query = (...a: unknown[]) => {
    n++
    return query(...a)
  }
  return () => n
}
