import t from 'tap'
import { Store } from '../../src/store/index.js'
import { STORE_BACKENDS, testStore } from '../helpers/gateway.js'

for (const backend of STORE_BACKENDS) {
  t.test(backend, async (t) => {
    t.test('transact: read-modify-writes of one key never interleave, and land in order', async (t) => {
      const { store } = await testStore(t, undefined, backend)
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
      const { store } = await testStore(t, undefined, backend)
      const c = store.collection<number>('counters')
      await t.rejects(
        store.transact('k', async () => Promise.reject(new Error('no'))),
        /no/,
      )
      const { written } = await store.transact('k', async () => ({ ops: [{ type: 'put' as const, coll: c, key: 'k', value: 1 }], result: null }))
      t.ok((await written).ok)
      t.equal(await c.get('k'), 1)
    })

    t.test('transact: a batch that cannot be written is reported in `written`, the result still returned, the key freed', async (t) => {
      const { store } = await testStore(t, undefined, backend)
      const c = store.collection<unknown>('counters')
      const { result, written } = await store.transact('k', async () => ({ ops: [{ type: 'put' as const, coll: c, key: 'k', value: 1n }], result: 'decided' }))
      t.equal(result, 'decided')
      t.notOk((await written).ok)
      t.equal(await c.get('k'), undefined, 'nothing written')
      const again = await store.transact('k', async () => ({ ops: [{ type: 'put' as const, coll: c, key: 'k', value: 2 }], result: null }))
      t.ok((await again.written).ok)
      t.equal(await c.get('k'), 2)
    })

    t.test('transact: keys and values with quotes, backslashes, escapes and SQL-looking text are written as given, with a delete in the batch', async (t) => {
      const { store } = await testStore(t, undefined, backend)
      const c = store.collection<unknown>("o'dd\\coll")
      await c.put('gone', 1)
      const odd = ["it's", 'back\\slash \\x41', '"quoted"', 'nul\u0000in', "'); DROP TABLE paygate_state; --", '$1::text[] $5', 'é 日本 🙂', "E'\\\\'"]
      const value = { odd, nested: { s: odd.join('') }, n: 1 }
      const { written } = await store.transact('k', async () => ({
        ops: [
          ...odd.map((k, i) => ({ type: 'put' as const, coll: c, key: `${k}\u0000${i}`, value: { k, i } })),
          { type: 'put' as const, coll: c, key: 'v', value },
          { type: 'del' as const, coll: c, key: 'gone' },
        ],
        result: null,
      }))
      t.ok((await written).ok, 'written')
      t.same(await c.get('v'), value, 'the value as given')
      t.same(
        await Promise.all(odd.map((k, i) => c.get(`${k}\u0000${i}`))),
        odd.map((k, i) => ({ k, i })),
        'every odd key, as given',
      )
      t.equal(await c.get('gone'), undefined, 'the delete in the same batch')
      if (backend !== 'postgres') return
      // The database refuses a NUL in a collection name: the write fails in the transaction, which is rolled back and frees the key.
      const bad = store.collection<unknown>('bad\u0000coll')
      const failed = await store.transact('k', async () => ({
        ops: [
          { type: 'put' as const, coll: c, key: 'w', value: 1 },
          { type: 'put' as const, coll: bad, key: 'x', value: 1 },
        ],
        result: null,
      }))
      t.notOk((await failed.written).ok, 'the write failed')
      t.equal(await c.get('w'), undefined, 'nothing of it written')
      const again = await store.transact('k', async () => ({ ops: [{ type: 'put' as const, coll: c, key: 'w', value: 2 }], result: null }))
      t.ok((await again.written).ok, 'the key is free again')
      t.equal(await c.get('w'), 2)
    })

    t.test('transact: different keys do not wait for each other', async (t) => {
      const { store } = await testStore(t, undefined, backend)
      const c = store.collection<number>('counters')
      let release!: () => void
      const gate = new Promise<void>((r) => (release = r))
      const slow = store.transact('a', async () => {
        await gate
        return { ops: [{ type: 'put' as const, coll: c, key: 'a', value: 1 }], result: null }
      })
      // 'b' commits while 'a' still holds its lock; 'a' is let go only after.
      const fast = await store.transact('b', async () => ({ ops: [{ type: 'put' as const, coll: c, key: 'b', value: 2 }], result: null }))
      t.ok((await fast.written).ok)
      t.equal(await c.get('b'), 2)
      t.equal(await c.get('a'), undefined, "'a' still open")
      release()
      t.ok((await (await slow).written).ok)
      t.equal(await c.get('a'), 1)
    })

    t.test('transact: tx.also holds a second key until the batch is written, across stores on one database', async (t) => {
      const { store, url } = await testStore(t, undefined, backend)
      const other = url ? await Store.open('/nonexistent-unused', { postgresUrl: url }) : store
      if (other !== store) t.teardown(() => other.close())
      const c = store.collection<number>('counters')
      // Many sections under different outer keys, all also taking 'shared': its read-modify-writes never interleave.
      const runs = Array.from({ length: 24 }, (_, i) =>
        (i % 2 ? other : store).transact(`outer-${i % 6}`, async (tx) => {
          await tx.also('shared')
          await tx.also('shared') // taking it twice is harmless
          const n = (await c.get('n')) ?? 0
          await new Promise((r) => setTimeout(r, 2)) // another holder would come in here without the lock
          return { ops: [{ type: 'put' as const, coll: c, key: 'n', value: n + 1 }], result: null }
        }),
      )
      for (const r of await Promise.all(runs)) t.ok((await r.written).ok)
      t.equal(await c.get('n'), 24, 'no lost update under the second key')
      // A plain transact of the second key waits for a section holding it.
      let release!: () => void
      const gate = new Promise<void>((r) => (release = r))
      const holding = store.transact('outer-x', async (tx) => {
        await tx.also('shared')
        await gate
        return { ops: [{ type: 'put' as const, coll: c, key: 'n', value: 100 }], result: null }
      })
      await new Promise((r) => setTimeout(r, 50))
      const after = other.transact('shared', async () => ({ ops: [], result: await c.get('n') }))
      await new Promise((r) => setTimeout(r, 50))
      release()
      await (await holding).written
      t.equal((await after).result, 100, 'it read after the holder wrote')
    })

    t.test('withInitLock: one holder at a time, across stores on one database; one-time setup runs once', async (t) => {
      const { store, url } = await testStore(t, undefined, backend)
      // On PostgreSQL a second store on the same database stands for another replica.
      const other = url ? await Store.open('/nonexistent-unused', { postgresUrl: url }) : store
      if (other !== store) t.teardown(() => other.close())
      let inside = 0
      let most = 0
      let made = 0
      const setup = (s: Store): Promise<string> =>
        s.withInitLock(async () => {
          most = Math.max(most, ++inside)
          const meta = s.collection<string>('meta')
          let id = await meta.get('id')
          await new Promise((r) => setTimeout(r, 5)) // another holder would come in here without the lock
          if (id === undefined) {
            id = `made-${++made}`
            await meta.put('id', id)
          }
          inside--
          return id
        })
      const ids = await Promise.all(Array.from({ length: 6 }, (_, i) => setup(i % 2 ? other : store)))
      t.equal(most, 1, 'never two holders at once')
      t.equal(made, 1, 'set up once')
      t.same(new Set(ids), new Set(['made-1']), 'every caller found the one setup')
      await t.rejects(
        store.withInitLock(async () => Promise.reject(new Error('setup failed'))),
        /setup failed/,
      )
      t.equal(await other.withInitLock(async () => 'free again'), 'free again', 'a failed holder frees the lock')
    })
  })
}
