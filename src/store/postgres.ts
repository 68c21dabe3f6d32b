import { createHash } from 'node:crypto'
import pg from 'pg'
import { KeyedMutex } from '../util/mutex.js'
import { outcome, type Result } from '../util/result.js'
import { LOCK, migrate, unusable, withSessionLock } from './postgres-schema.js'
import type { BatchOp, Collection, RangeOptions, Store, StoreOptions, Txn } from './types.js'

/**
 * PostgreSQL state (the `pg` package lives only here and in `postgres-schema.ts`), shared by
 * every replica that names the same database. Same contract as the LevelDB store:
 *
 * - A batch resolves once committed; batches called in one tick are written together in one
 *   statement (so one commit carries many), and groups are written one after another in call
 *   order, so a key's later state never lands before an earlier one.
 * - `transact(key, fn)` is exact across processes: a transaction takes the advisory
 *   transaction lock of `key` (`pg_advisory_xact_lock`), `fn` reads, and its batch is written
 *   in that transaction; COMMIT writes the batch and frees the lock at once, so the next
 *   holder, in any process, reads after it. See docs/replicas.md for why a lock on the key
 *   rather than row locks or SERIALIZABLE.
 */

/** One op as written: the collection, the key's UTF-8 bytes and the value's JSON text (`undefined`: delete). */
interface Row {
  coll: string
  key: Buffer
  value: string | undefined
}

const PAGE = 256
const UPSERT = `WITH d AS (
    DELETE FROM paygate_state s USING unnest($1::text[], $2::bytea[]) AS x(coll, key)
    WHERE s.coll = x.coll AND s.key = x.key
  )
  INSERT INTO paygate_state (coll, key, value) SELECT * FROM unnest($3::text[], $4::bytea[], $5::text[])
  ON CONFLICT (coll, key) DO UPDATE SET value = EXCLUDED.value`

const bytes = (key: string): Buffer => Buffer.from(key, 'utf8')

/** The one-bigint advisory lock id of a transact() key: 64 bits of its SHA-256 (a collision only serialises two keys). */
export const lockId = (key: string): string => createHash('sha256').update(key, 'utf8').digest().readBigInt64BE(0).toString()

function encode(op: BatchOp): Row {
  const coll = op.coll.name
  if (op.type === 'del') return { coll, key: bytes(op.key), value: undefined }
  const value = op.latest ? op.latest() : op.value
  if (value === null || value === undefined) throw new TypeError(`store: a put needs a value (${coll}/${op.key})`)
  return { coll, key: bytes(op.key), value: JSON.stringify(value) }
}

/** The `logged` callbacks of a committed batch's puts (BatchOp). */
function runLogged(ops: readonly BatchOp[]): void {
  for (const op of ops) if (op.type === 'put' && op.logged) op.logged()
}

/** A batch of `write` is committed: its `logged` callbacks, then its caller. */
function committed(p: { ops: readonly BatchOp[]; resolve: () => void }): void {
  runLogged(p.ops)
  p.resolve()
}

/** The statement that writes `rows` (a key's last state wins): deletes and upserts in one. */
function writeQuery(rows: Iterable<Row>): pg.QueryConfig {
  const last = new Map<string, Row>()
  for (const r of rows) last.set(`${r.coll}\u0000${r.key.toString('hex')}`, r)
  const del: Row[] = []
  const put: Row[] = []
  for (const r of last.values()) (r.value === undefined ? del : put).push(r)
  return {
    name: 'paygate_write',
    text: UPSERT,
    values: [del.map((r) => r.coll), del.map((r) => r.key), put.map((r) => r.coll), put.map((r) => r.key), put.map((r) => r.value)],
  }
}

/**
 * `writeQuery`'s statement with its values inlined as literals, so that COMMIT can follow it in
 * one simple-protocol query (which takes no parameters): a transact() then holds its lock one
 * round trip less. Text through pg's `escapeLiteral`; keys as hex, `decode`d.
 */
function inlined(q: pg.QueryConfig): string {
  const [delColls, delKeys, putColls, putKeys, putValues] = q.values as [string[], Buffer[], string[], Buffer[], string[]]
  const texts = (a: string[]): string => `ARRAY[${a.map((x) => pg.escapeLiteral(x)).join(',')}]::text[]`
  const keys = (a: Buffer[]): string => `ARRAY[${a.map((k) => `decode('${k.toString('hex')}','hex')`).join(',')}]::bytea[]`
  const args = [texts(delColls), keys(delKeys), texts(putColls), keys(putKeys), texts(putValues)]
  return q.text.replace(/\$([1-5])(::[a-z]+\[\])/g, (_, i: string) => args[Number(i) - 1]!)
}

/** A range read's WHERE and ORDER BY, from `opts` with `after` (the last key of the previous page). */
function rangeQuery(what: string, coll: string, opts: RangeOptions, after: Buffer | undefined, limit: number): pg.QueryConfig {
  const values: unknown[] = [coll]
  const where = ['coll = $1']
  const bound = (op: string, key: Buffer | string | undefined): void => {
    if (key === undefined) return
    values.push(typeof key === 'string' ? bytes(key) : key)
    where.push(`key ${op} $${values.length}`)
  }
  bound('>', opts.gt)
  bound('>=', opts.gte)
  bound('<', opts.lt)
  bound('<=', opts.lte)
  bound(opts.reverse ? '<' : '>', after)
  values.push(limit)
  return { text: `SELECT ${what} FROM paygate_state WHERE ${where.join(' AND ')} ORDER BY key ${opts.reverse ? 'DESC' : 'ASC'} LIMIT $${values.length}`, values }
}

class PostgresCollection<T> implements Collection<T> {
  constructor(
    readonly name: string,
    private readonly store: PostgresStore,
  ) {}
  async get(key: string): Promise<T | undefined> {
    const v = await this.store.read(this.name, key)
    return v === undefined ? undefined : (JSON.parse(v) as T)
  }
  async getMany(keys: string[]): Promise<(T | undefined)[]> {
    if (!keys.length) return []
    const r = await this.store.query<{ key: Buffer; value: string }>({
      name: 'paygate_get_many',
      text: 'SELECT key, value FROM paygate_state WHERE coll = $1 AND key = ANY($2::bytea[])',
      values: [this.name, keys.map(bytes)],
    })
    const found = new Map(r.rows.map((row) => [row.key.toString('utf8'), row.value]))
    return keys.map((k) => {
      const v = found.get(k)
      return v === undefined ? undefined : (JSON.parse(v) as T)
    })
  }
  put(key: string, value: T): Promise<void> {
    return this.store.batch([{ type: 'put', coll: this, key, value }])
  }
  del(key: string): Promise<void> {
    return this.store.batch([{ type: 'del', coll: this, key }])
  }
  /** Read in pages of PAGE rows (each from where the last ended), so a long range is never held in memory. */
  private async *rows(what: string, opts: RangeOptions): AsyncIterable<{ key: Buffer; value?: string }> {
    let left = opts.limit !== undefined && opts.limit >= 0 ? opts.limit : Number.POSITIVE_INFINITY
    let after: Buffer | undefined
    while (left > 0) {
      const n = Math.min(PAGE, left)
      const { rows } = await this.store.query<{ key: Buffer; value?: string }>(rangeQuery(what, this.name, opts, after, n))
      for (const row of rows) yield row
      left -= rows.length
      if (rows.length < n) return
      after = rows[rows.length - 1]!.key
    }
  }
  async *entries(opts: RangeOptions = {}): AsyncIterable<[string, T]> {
    for await (const r of this.rows('key, value', opts)) yield [r.key.toString('utf8'), JSON.parse(r.value!) as T]
  }
  async *keys(opts: RangeOptions = {}): AsyncIterable<string> {
    for await (const r of this.rows('key', opts)) yield r.key.toString('utf8')
  }
}

interface Pending {
  ops: BatchOp[]
  resolve: () => void
  reject: (e: unknown) => void
}

/** A point read waiting for a free read slot. */
interface Read {
  coll: string
  key: string
  resolve: (value: string | undefined) => void
  reject: (e: unknown) => void
}

/**
 * Point reads in flight at once per process. More wait, and go together in one statement when
 * a slot frees: under load one round trip serves many (each costs both processes far more
 * than the row lookup), and when idle a read goes at once as before.
 */
const READ_SLOTS = 4
// A subquery per key: one primary-key lookup each, where a join may be planned as a scan of the table.
const READ_MANY = `SELECT x.i, (SELECT s.value FROM paygate_state s WHERE s.coll = x.coll AND s.key = x.key) AS value
  FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS x(coll, key, i)`

export class PostgresStore implements Store {
  readonly backend = 'postgres' as const
  readonly recovered = { batches: 0, torn: 0 }
  applyError: unknown
  private readonly colls = new Map<string, PostgresCollection<unknown>>()
  private readonly locks = new KeyedMutex()
  private pending: Pending[] = []
  private readonly reads: Read[] = []
  private readsInFlight = 0
  private flushQueued = false
  private writing: Promise<void> = Promise.resolve()
  private state: 'open' | 'closing' | 'closed' = 'open'
  private closed?: Promise<void>

  private constructor(
    /** Reads and batches: each holds a connection for one statement. */
    private readonly pool: pg.Pool,
    /** transact(): each holds a connection for its transaction, while `fn` reads through `pool`. */
    private readonly lockPool: pg.Pool,
  ) {
    const onError = (e: unknown): void => {
      this.applyError = e
    }
    // An idle connection that breaks is reported here; without a listener it would end the process.
    pool.on('error', onError)
    lockPool.on('error', onError)
  }

  /** Connect, migrate the schema (under the migration lock), and serve. */
  static async open(url: string, opts: StoreOptions = {}): Promise<PostgresStore> {
    const size = opts.postgresPoolSize ?? 10
    const base = { connectionString: url, application_name: 'paygate' }
    // A transaction left open by a stuck holder would keep its key locked for every replica.
    const pool = new pg.Pool({ ...base, max: size })
    const lockPool = new pg.Pool({ ...base, max: size, idle_in_transaction_session_timeout: 30_000 })
    const store = new PostgresStore(pool, lockPool)
    try {
      await migrate(pool)
    } catch (e) {
      await store.close()
      throw unusable(url, e)
    }
    return store
  }

  get status(): string {
    return this.state
  }

  collection<T>(name: string): Collection<T> {
    let c = this.colls.get(name) as PostgresCollection<T> | undefined
    if (!c) {
      c = new PostgresCollection<T>(name, this)
      this.colls.set(name, c as PostgresCollection<unknown>)
    }
    return c
  }

  /** One statement on the shared pool; a connection failure is kept as `applyError` until a statement works again. */
  async query<R extends pg.QueryResultRow>(q: pg.QueryConfig): Promise<pg.QueryResult<R>> {
    try {
      const r = await this.pool.query<R>(q)
      this.applyError = undefined
      return r
    } catch (e) {
      if (!(e instanceof pg.DatabaseError)) this.applyError = e
      throw e
    }
  }

  /**
   * One entry's JSON text. Sent at once while a read slot is free, else with the reads queued
   * behind it when one frees: always after the call, so it sees every commit before the call.
   */
  read(coll: string, key: string): Promise<string | undefined> {
    return new Promise((resolve, reject) => {
      this.reads.push({ coll, key, resolve, reject })
      this.pumpReads()
    })
  }

  private pumpReads(): void {
    while (this.readsInFlight < READ_SLOTS && this.reads.length) {
      const group = this.reads.splice(0, 500)
      this.readsInFlight++
      void this.readGroup(group).finally(() => {
        this.readsInFlight--
        this.pumpReads()
      })
    }
  }

  private async readGroup(group: Read[]): Promise<void> {
    try {
      if (group.length === 1) {
        const { coll, key, resolve } = group[0]!
        const r = await this.query<{ value: string }>({ name: 'paygate_get', text: 'SELECT value FROM paygate_state WHERE coll = $1 AND key = $2', values: [coll, bytes(key)] })
        resolve(r.rows[0]?.value)
        return
      }
      const r = await this.query<{ i: string; value: string | null }>({ name: 'paygate_read_many', text: READ_MANY, values: [group.map((g) => g.coll), group.map((g) => bytes(g.key))] })
      const found = new Map(r.rows.map((row) => [Number(row.i) - 1, row.value ?? undefined]))
      for (const [i, g] of group.entries()) g.resolve(found.get(i))
    } catch (e) {
      for (const g of group) g.reject(e)
    }
  }

  withInitLock<T>(fn: () => Promise<T>): Promise<T> {
    return withSessionLock(this.pool, LOCK.init, fn)
  }

  async transact<T>(key: string, fn: (tx: Txn) => Promise<{ ops: readonly BatchOp[]; result: T }>): Promise<{ result: T; written: Promise<Result<void>> }> {
    if (this.state !== 'open') throw new Error('store: closed')
    // Same-key callers in this process queue here rather than each holding a connection.
    return this.locks.run(key, async () => {
      const c = await this.lockPool.connect()
      // A connection that failed is closed on release; one whose `fn` failed is rolled back and reused.
      let broken: Error | undefined
      let fnFailed = false
      try {
        // BEGIN and the lock in one round trip (one simple-protocol query; the id is an integer we computed).
        await c.query(`BEGIN; SELECT pg_advisory_xact_lock(${lockId(key)})`)
        const held = new Map<string, Promise<unknown>>([[key, Promise.resolve()]])
        // More keys on the same transaction: freed with it, and no second connection to wait for.
        const tx: Txn = {
          also: async (other) => {
            const got = held.get(other) ?? c.query({ name: 'paygate_lock', text: 'SELECT pg_advisory_xact_lock($1::bigint)', values: [lockId(other)] })
            held.set(other, got)
            await got
          },
        }
        let out: { ops: readonly BatchOp[]; result: T }
        try {
          out = await fn(tx)
        } catch (e) {
          fnFailed = true
          await c.query('ROLLBACK').catch((err: Error) => (broken = err))
          throw e
        }
        const written = await outcome(
          (async () => {
            const rows = out.ops.map(encode)
            await c.query(rows.length ? `${inlined(writeQuery(rows))}; COMMIT` : 'COMMIT')
          })(),
        )
        if (!written.ok) await c.query('ROLLBACK').catch((err: Error) => (broken = err))
        else runLogged(out.ops)
        return { result: out.result, written: Promise.resolve(written) }
      } catch (e) {
        if (!fnFailed) broken ??= e as Error
        throw e
      } finally {
        c.release(broken)
      }
    })
  }

  batch(ops: BatchOp[]): Promise<void> {
    if (!ops.length) return Promise.resolve()
    if (this.state !== 'open') return Promise.reject(new Error('store: closed'))
    return new Promise((resolve, reject) => {
      this.pending.push({ ops, resolve, reject })
      if (!this.flushQueued) {
        this.flushQueued = true
        queueMicrotask(() => {
          this.flushQueued = false
          const group = this.pending.splice(0, this.pending.length)
          this.writing = this.writing.then(() => this.write(group))
        })
      }
    })
  }

  /**
   * Write one tick's batches in one statement, after the previous group (call order). Values
   * (`latest`) are taken now, when the group is handed to the database. A batch that cannot
   * be encoded fails alone; if the database refuses the group, each batch is tried alone so
   * only the one at fault fails.
   */
  private async write(group: Pending[]): Promise<void> {
    const ok: { rows: Row[]; p: Pending }[] = []
    for (const p of group) {
      try {
        ok.push({ rows: p.ops.map(encode), p })
      } catch (e) {
        p.reject(e)
      }
    }
    if (!ok.length) return
    const all = await outcome(this.query(writeQuery(ok.flatMap((b) => b.rows))))
    if (all.ok || ok.length === 1) {
      for (const b of ok) all.ok ? committed(b.p) : b.p.reject(all.error)
      return
    }
    for (const b of ok) {
      const one = await outcome(this.query(writeQuery(b.rows)))
      one.ok ? committed(b.p) : b.p.reject(one.error)
    }
  }

  /** A batch is acknowledged once committed: nothing is left to apply. */
  settled(): Promise<void> {
    return Promise.resolve()
  }

  /** Write what was called, then close both pools. */
  close(): Promise<void> {
    this.closed ??= (async () => {
      this.state = 'closing'
      // Batches queued this tick are flushed by their microtask; wait for it and the writes.
      await new Promise((r) => setImmediate(r))
      await this.writing
      await Promise.all([this.pool.end(), this.lockPool.end()])
      this.state = 'closed'
    })()
    return this.closed
  }
}
