import t from 'tap'
import { Store } from '../../src/store/index.js'
import { STORE_BACKENDS, testStore } from '../helpers/gateway.js'

const collect = async <T>(it: AsyncIterable<T>): Promise<T[]> => {
  const out: T[] = []
  for await (const x of it) out.push(x)
  return out
}

// In UTF-8 byte order (LevelDB's): 'B' 0x42 < 'a' 0x61 < 'z' 0x7a < 'é' 0xc3a9 < U+FFFF 0xefbfbf < '😀' 0xf09f9880.
// UTF-16 order would put '😀' (0xd83d) before U+FFFF.
const ORDERED = ['B', 'a', 'a\x00', 'a\x00x', 'a\x01', 'z', 'é', '\uffff', '😀']

for (const backend of STORE_BACKENDS) {
  t.test(backend, async (t) => {
    const { store, dir, url } = await testStore(t, 'paygate-colls-', backend)
    const things = store.collection<{ n: number }>('things')
    const other = store.collection<string>('other')
    const shuffled = [...ORDERED].reverse()
    await store.batch(shuffled.map((key, n) => ({ type: 'put' as const, coll: things, key, value: { n } })))
    await other.put('a', 'not in things')

    t.test('range reads walk keys in UTF-8 byte order, NUL separators included', async (t) => {
      t.same(await collect(things.keys()), ORDERED)
      t.same(await collect(things.keys({ reverse: true })), [...ORDERED].reverse())
      const entries = await collect(things.entries())
      t.same(
        entries.map(([k, v]) => [k, v.n]),
        ORDERED.map((k) => [k, shuffled.indexOf(k)]),
      )
    })

    t.test('bounds, limit and reverse', async (t) => {
      t.same(await collect(things.keys({ gt: 'a\x00', lt: 'a\x01' })), ['a\x00x'], 'a prefix range as the indexes read them')
      t.same(await collect(things.keys({ gte: 'a\x00', lte: 'a\x01' })), ['a\x00', 'a\x00x', 'a\x01'])
      t.same(await collect(things.keys({ gt: 'a', limit: 2 })), ['a\x00', 'a\x00x'])
      t.same(await collect(things.keys({ lt: 'z', reverse: true, limit: 3 })), ['a\x01', 'a\x00x', 'a\x00'])
      t.same(await collect(things.keys({ gte: 'é' })), ['é', '\uffff', '😀'])
      t.same(await collect(things.keys({ limit: 0 })), [])
    })

    t.test('a long range is read whole, past any page size', async (t) => {
      const many = store.collection<number>('many')
      const keys = Array.from({ length: 700 }, (_, i) => `k${String(i).padStart(4, '0')}`)
      await store.batch(keys.map((key, i) => ({ type: 'put' as const, coll: many, key, value: i })))
      t.same(await collect(many.keys()), keys)
      t.same(await collect(many.keys({ reverse: true, limit: 600 })), [...keys].reverse().slice(0, 600))
      t.same((await collect(many.entries({ gte: 'k0300' }))).length, 400)
    })

    t.test('point reads, getMany in the asked order, deletes; collections are apart', async (t) => {
      t.same(await things.get('a\x00x'), { n: shuffled.indexOf('a\x00x') })
      t.equal(await things.get('missing'), undefined)
      t.same(
        (await things.getMany(['z', 'missing', 'B'])).map((v) => v?.n),
        [shuffled.indexOf('z'), undefined, shuffled.indexOf('B')],
      )
      t.same(await things.getMany([]), [])
      t.equal(await other.get('a'), 'not in things')
      await things.del('z')
      t.equal(await things.get('z'), undefined)
      t.equal(await other.get('a'), 'not in things', 'a delete in one collection leaves the others')
      await things.put('z', { n: -1 })
    })

    t.test('one batch across collections, puts and deletes; the last op on a key wins', async (t) => {
      await store.batch([
        { type: 'put', coll: other, key: 'x', value: 'one' },
        { type: 'put', coll: other, key: 'x', value: 'two' },
        { type: 'put', coll: things, key: 'y', value: { n: 1 } },
        { type: 'del', coll: things, key: 'y' },
        { type: 'del', coll: other, key: 'a' },
      ])
      t.equal(await other.get('x'), 'two')
      t.equal(await things.get('y'), undefined)
      t.equal(await other.get('a'), undefined)
    })

    t.test('values come back as stored JSON, across a reopen', async (t) => {
      const odd = { s: 'nul \u0000 and é 😀', nested: { b: 2, a: [1, null, true] }, big: 2 ** 53 - 1 }
      await store.collection('odd').put('k', odd)
      await store.close()
      const again = await Store.open(dir, url ? { postgresUrl: url } : {})
      t.teardown(() => again.close())
      t.same(await again.collection('odd').get('k'), odd)
      t.equal(JSON.stringify(await again.collection('odd').get('k')), JSON.stringify(odd), 'key order kept')
      t.same(await collect(again.collection('things').keys()), ORDERED)
    })
  })
}
