import pg from 'pg'
import { PaygateError } from '../errors/index.js'
import { shownUrl } from '../util/redact.js'

/**
 * The PostgreSQL schema, as numbered migrations run in order at start. A migration is never
 * edited once released: a change is a new entry at the end.
 *
 * Every collection lives in one table, `paygate_state (coll, key, value)`: collections are
 * named at run time by whoever opens them (`store.collection(name)`), so one table needs no
 * DDL outside these migrations, and a batch across collections is one statement on one
 * table. Keys are `bytea`: they hold NUL separators (`<agentId>\0<id>`), which `text` cannot,
 * and `bytea` compares as memcmp, which is LevelDB's byte order (a `text` key would need
 * `COLLATE "C"` for that). Values are the JSON text LevelDB stores, byte for byte: `jsonb`
 * would refuse `\u0000` in strings and reorder object keys.
 */
export const MIGRATIONS: readonly { version: number; name: string; sql: string }[] = [
  {
    version: 1,
    name: 'state table',
    sql: `CREATE TABLE paygate_state (
      coll text COLLATE "C" NOT NULL,
      key bytea NOT NULL,
      value text NOT NULL,
      PRIMARY KEY (coll, key)
    )`,
  },
]

export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version

/**
 * Session-level advisory locks of Paygate, in the two-int key space (`pg_advisory_lock(int4,
 * int4)`), which PostgreSQL keeps apart from the one-bigint space that `transact` uses.
 */
export const LOCK_CLASS = 0x70617967 // "payg"
export const LOCK = { migrate: 1, init: 2 } as const

/** Thrown when the database was migrated by a newer Paygate: this one must not write to it. */
export class SchemaTooNewError extends Error {
  constructor(
    readonly found: number,
    readonly known: number,
  ) {
    super(
      `store: the PostgreSQL schema is at version ${found}, newer than this Paygate knows (${known}); ` +
        'a newer Paygate migrated this database: run that version on this replica too (refusing to start)',
    )
    this.name = 'SchemaTooNewError'
  }
}

/** Run `fn` holding the session advisory lock `id` on its own connection. */
export async function withSessionLock<T>(pool: pg.Pool, id: number, fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
  const c = await pool.connect()
  let broken: Error | undefined
  try {
    await c.query('SELECT pg_advisory_lock($1, $2)', [LOCK_CLASS, id])
    try {
      return await fn(c)
    } finally {
      await c.query('SELECT pg_advisory_unlock($1, $2)', [LOCK_CLASS, id]).catch((e: Error) => (broken = e))
    }
  } catch (e) {
    broken ??= e as Error
    throw e
  } finally {
    // A connection that failed is closed, which also frees any lock it still held.
    c.release(broken)
  }
}

/**
 * Bring the schema to SCHEMA_VERSION under the migration lock, so replicas starting together
 * migrate once; each migration commits with its version row. Refuses a newer schema and a
 * database whose encoding is not UTF-8 (values are UTF-8 JSON text).
 */
export async function migrate(pool: pg.Pool): Promise<{ from: number; to: number }> {
  return withSessionLock(pool, LOCK.migrate, async (c) => {
    const enc = (await c.query<{ server_encoding: string }>('SHOW server_encoding')).rows[0]!.server_encoding
    if (enc.toUpperCase() !== 'UTF8') throw new Error(`store: the PostgreSQL database must use UTF8 encoding (it uses ${enc})`)
    await c.query(`CREATE TABLE IF NOT EXISTS paygate_migrations (
      version integer PRIMARY KEY,
      name text NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT now()
    )`)
    const from = Number((await c.query<{ v: number | null }>('SELECT max(version) AS v FROM paygate_migrations')).rows[0]!.v ?? 0)
    if (from > SCHEMA_VERSION) throw new SchemaTooNewError(from, SCHEMA_VERSION)
    for (const m of MIGRATIONS) {
      if (m.version <= from) continue
      await c.query('BEGIN')
      try {
        await c.query(m.sql)
        await c.query('INSERT INTO paygate_migrations (version, name) VALUES ($1, $2)', [m.version, m.name])
        await c.query('COMMIT')
      } catch (e) {
        await c.query('ROLLBACK')
        throw e
      }
    }
    return { from, to: SCHEMA_VERSION }
  })
}

/**
 * Why the first use of the database failed, naming the setting: pg's own messages ("connect
 * ECONNREFUSED", "database x does not exist") do not say that PostgreSQL is what was asked. The
 * server's refusals (credentials, a database or a privilege missing) are the configuration's
 * (exit 2); a server not reached may be down only for now (exit 1). The schema's own refusals
 * (migrate's) say it already and pass unchanged.
 */
export function unusable(url: string, e: unknown): unknown {
  const refused = e instanceof pg.DatabaseError
  const message = e instanceof Error ? e.message : String(e)
  const unreached = !refused && (typeof (e as { code?: unknown }).code === 'string' || /connection terminated|timeout/i.test(message))
  if (!refused && !unreached) return e
  const hint = refused && e.code === '42501' ? ' (the first start creates tables: the role needs CREATE on the schema)' : ''
  const detail = `store.postgresUrl (${shownUrl(url)}): PostgreSQL ${refused ? 'refused' : 'could not be reached'}: ${message}${hint}`
  return new PaygateError(refused ? 'invalid_config' : 'unavailable', detail, { cause: e })
}
