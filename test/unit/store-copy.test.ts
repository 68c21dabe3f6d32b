import pg from 'pg'
import t, { type Test } from 'tap'
import { copyLevelToPostgres } from '../../src/store/copy.js'
import { LevelStore } from '../../src/store/index.js'
import { PostgresStore } from '../../src/store/postgres.js'
import { testDir } from '../helpers/gateway.js'
import { testDatabase } from '../helpers/postgres.js'

/** The copy of a LevelDB store into PostgreSQL (`paygate copy-store`), against a real LevelDB and a throwaway cluster. */

async function rows(url: string): Promise<{ coll: string; key: string; value: string }[]> {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    const r = await c.query<{ coll: string; key: Buffer; value: string }>('SELECT coll, key, value FROM paygate_state ORDER BY coll, key')
    return r.rows.map((row) => ({ coll: row.coll, key: row.key.toString('utf8'), value: row.value }))
  } finally {
    await c.end()
  }
}

async function levelStore(t: Test, opts: { applyDelayMs?: number } = {}): Promise<LevelStore> {
  const s = await LevelStore.open(testDir(t), opts)
  t.teardown(() => s.close())
  return s
}

t.test('every collection, every entry, the JSON text byte for byte, across many batches', async (t) => {
  const src = await levelStore(t)
  const a = src.collection<{ n: number; s: string }>('alpha')
  const b = src.collection<string>('beta')
  const ab = src.collection<number[]>('alphabet')
  for (let i = 0; i < 1203; i++) await a.put(`k${String(i).padStart(5, '0')}`, { n: i, s: `é ${i} \u0000 "q"` })
  await b.put('agent\u0000tx_1', 'NUL in the key')
  await b.put('ключ', 'unicode key')
  await ab.put('x', [1, 2.5, -3])
  const report = await copyLevelToPostgres(src, await testDatabase(), { batchSize: 100 })
  t.same(report.collections, [
    { name: 'alpha', entries: 1203 },
    { name: 'alphabet', entries: 1 },
    { name: 'beta', entries: 2 },
  ])
  t.equal(report.total, 1206)
})

t.test('the copy reads back the same through both stores, raw and parsed', async (t) => {
  const src = await levelStore(t)
  const c = src.collection<unknown>('mixed')
  const values: [string, unknown][] = [
    ['a', { nested: { deep: [1, { x: null }] }, big: '123456789012345678901234567890' }],
    ['b', 'text with \u2028 and emoji 🙂'],
    ['c', 0.1],
    ['d\u0000e', true],
  ]
  for (const [k, v] of values) await c.put(k, v)
  const url = await testDatabase()
  await copyLevelToPostgres(src, url)
  const raw: { coll: string; key: string; value: string }[] = []
  for await (const [coll, key, value] of src.dump()) raw.push({ coll, key, value })
  t.same(await rows(url), raw, 'the rows are the LevelDB entries, text for text')
  const dst = await PostgresStore.open(url)
  t.teardown(() => dst.close())
  const back: [string, unknown][] = []
  for await (const e of dst.collection<unknown>('mixed').entries()) back.push(e)
  t.same(back, values, 'and read as the same values through the Store API')
})

t.test('what is logged but not yet in LevelDB is copied (the dump waits for it)', async (t) => {
  const src = await levelStore(t, { applyDelayMs: 600_000 })
  await src.collection<string>('late').put('k', 'logged only')
  const url = await testDatabase()
  await copyLevelToPostgres(src, url)
  t.same(await rows(url), [{ coll: 'late', key: 'k', value: '"logged only"' }])
})

t.test('extra entries (the CA) go in with the rest', async (t) => {
  const src = await levelStore(t)
  await src.collection<string>('meta').put('m', 'v')
  const url = await testDatabase()
  const report = await copyLevelToPostgres(src, url, { extra: [{ coll: 'ca', key: 'authority', value: '{"certPem":"x"}' }] })
  t.same(report.collections, [
    { name: 'ca', entries: 1 },
    { name: 'meta', entries: 1 },
  ])
})

t.test('a database that holds Paygate state is refused, and a failed copy leaves nothing', async (t) => {
  const src = await levelStore(t)
  await src.collection<string>('meta').put('m', 'v')
  const url = await testDatabase()
  // The extra entry collides with a source entry: the INSERT fails after the source rows went in.
  await t.rejects(copyLevelToPostgres(src, url, { extra: [{ coll: 'meta', key: 'm', value: '"other"' }] }), /duplicate key/)
  t.same(await rows(url), [], 'rolled back: the database is as it was')
  await copyLevelToPostgres(src, url)
  await t.rejects(copyLevelToPostgres(src, url), { code: 'invalid_config', message: /already holds Paygate state \(meta: 1\).*drop and recreate it/ })
  t.same(await rows(url), [{ coll: 'meta', key: 'm', value: '"v"' }], 'the second copy changed nothing')
})

t.test('an empty LevelDB store copies nothing and migrates the database', async (t) => {
  const src = await levelStore(t)
  const url = await testDatabase()
  t.same(await copyLevelToPostgres(src, url), { collections: [], total: 0 })
  t.same(await rows(url), [])
})
