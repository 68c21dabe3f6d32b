import pg from 'pg'
import { PaygateError } from '../errors/index.js'
import type { LevelStore } from './level.js'
import { migrate } from './postgres-schema.js'

/**
 * Copy a LevelDB store into a PostgreSQL database (`paygate copy-store`): every collection's
 * every entry, the value's JSON text byte for byte, into `paygate_state`. It runs as ONE
 * transaction holding a lock on the table that keeps replicas from writing meanwhile: the rows
 * go in bounded batches, then counts per collection and every entry are compared with the
 * source in the same transaction, and it commits only if they match. A failed or interrupted
 * copy leaves the database as it was, so it can simply be run again.
 *
 * A database that already holds Paygate state is refused (there is no `--force`): merging two
 * gateways' state would mix budgets, keys and records; drop and recreate the database instead.
 */

/** One entry as stored: collection, key, the value's JSON text. */
export interface RawEntry {
  coll: string
  key: string
  value: string
}

export interface CopyReport {
  /** Entries per collection, in collection name order, as verified in the database. */
  collections: { name: string; entries: number }[]
  total: number
}

export interface CopyOptions {
  /** Entries that are not in LevelDB but belong in the database (the interception CA). */
  extra?: RawEntry[]
  /** Rows per INSERT and per verification read. Default 500. */
  batchSize?: number
}

const INSERT = 'INSERT INTO paygate_state (coll, key, value) SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[])'
const bytes = (key: string): Buffer => Buffer.from(key, 'utf8')

async function* entriesOf(source: LevelStore, extra: RawEntry[]): AsyncIterable<RawEntry> {
  for await (const [coll, key, value] of source.dump()) yield { coll, key, value }
  yield* extra
}

/** Walk the source in batches of `size`; `fn` gets each batch. */
async function inBatches(source: LevelStore, extra: RawEntry[], size: number, fn: (rows: RawEntry[]) => Promise<void>): Promise<void> {
  let rows: RawEntry[] = []
  for await (const e of entriesOf(source, extra)) {
    rows.push(e)
    if (rows.length >= size) {
      await fn(rows)
      rows = []
    }
  }
  if (rows.length) await fn(rows)
}

async function countsIn(c: pg.ClientBase): Promise<Map<string, number>> {
  const r = await c.query<{ coll: string; n: string }>('SELECT coll, count(*) AS n FROM paygate_state GROUP BY coll ORDER BY coll')
  return new Map(r.rows.map((row) => [row.coll, Number(row.n)]))
}

/** Every source entry is in the database with the same text, and no collection has more or other entries. */
async function verify(c: pg.ClientBase, source: LevelStore, extra: RawEntry[], size: number, written: Map<string, number>): Promise<Map<string, number>> {
  const counts = await countsIn(c)
  const names = new Set([...counts.keys(), ...written.keys()])
  for (const name of names) {
    if (counts.get(name) !== written.get(name)) throw new Error(`store copy: collection ${name} has ${counts.get(name) ?? 0} entries in the database, ${written.get(name) ?? 0} copied`)
  }
  await inBatches(source, extra, size, async (rows) => {
    const r = await c.query<{ coll: string; key: Buffer; value: string }>(
      'SELECT t.coll, t.key, t.value FROM paygate_state t JOIN unnest($1::text[], $2::bytea[]) AS x(coll, key) ON t.coll = x.coll AND t.key = x.key',
      [rows.map((e) => e.coll), rows.map((e) => bytes(e.key))],
    )
    const found = new Map(r.rows.map((row) => [`${row.coll}\u0000${row.key.toString('hex')}`, row.value]))
    for (const e of rows) {
      if (found.get(`${e.coll}\u0000${bytes(e.key).toString('hex')}`) !== e.value) throw new Error(`store copy: ${e.coll}/${JSON.stringify(e.key)} differs in the database after the copy`)
    }
  })
  return counts
}

/** Copy `source` into the database at `url` (migrated first); see the module comment. */
export async function copyLevelToPostgres(source: LevelStore, url: string, opts: CopyOptions = {}): Promise<CopyReport> {
  const size = opts.batchSize ?? 500
  const extra = opts.extra ?? []
  const pool = new pg.Pool({ connectionString: url, application_name: 'paygate copy-store', max: 2 })
  pool.on('error', () => {})
  try {
    await migrate(pool)
    const c = await pool.connect()
    let broken: Error | undefined
    try {
      await c.query('BEGIN')
      try {
        // Replicas' writes wait (and a second copy finds this one's rows and refuses); reads go on.
        await c.query('LOCK TABLE paygate_state IN SHARE ROW EXCLUSIVE MODE')
        const before = await countsIn(c)
        if (before.size) {
          const held = [...before].map(([name, n]) => `${name}: ${n}`).join(', ')
          throw new PaygateError('invalid_config', `the database already holds Paygate state (${held}); copy-store fills an empty database only: drop and recreate it to copy again`)
        }
        const written = new Map<string, number>()
        await inBatches(source, extra, size, async (rows) => {
          await c.query(INSERT, [rows.map((e) => e.coll), rows.map((e) => bytes(e.key)), rows.map((e) => e.value)])
          for (const e of rows) written.set(e.coll, (written.get(e.coll) ?? 0) + 1)
        })
        const counts = await verify(c, source, extra, size, written)
        await c.query('COMMIT')
        const collections = [...counts].map(([name, entries]) => ({ name, entries }))
        return { collections, total: collections.reduce((k, x) => k + x.entries, 0) }
      } catch (e) {
        await c.query('ROLLBACK').catch((err: Error) => (broken = err))
        throw e
      }
    } finally {
      c.release(broken)
    }
  } finally {
    await pool.end()
  }
}
