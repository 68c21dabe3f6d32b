import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { Level } from 'level'
import { PaygateError } from '../errors/index.js'
import { lockFile, type FileLock } from '../util/file-lock.js'
import { KeyedMutex } from '../util/mutex.js'
import { outcome, type Result } from '../util/result.js'
import type { BatchOp, Collection, RangeOptions, Store, StoreOptions, Txn } from './types.js'
import { Wal } from './wal.js'
import { APPLY_DELAY_MS, levelOps, type Logged, type TextBatches, WriteBehind } from './write-behind.js'

/**
 * LevelDB state (the `level` package lives only here). Each resource is a named
 * collection (a sublevel with JSON values); every multi-key change goes through
 * `batch`, which is atomic across collections.
 *
 * A batch is durable when its record is in the write-ahead log (`wal.ts`, one `writeSync` for
 * all the batches of a turn of the event loop); LevelDB is written behind it, several batches
 * per write (`write-behind.ts`). Until then point reads (`get`, `getMany`) are answered from
 * the logged (or staged) values, and range reads wait until LevelDB holds every batch made
 * before they began. Opening replays the log into LevelDB.
 */
type Sub<T> = ReturnType<Level<string, unknown>['sublevel']> & { __t?: T }

/**
 * Values are stored as the JSON text the collections' `json` encoding would produce. The root
 * database takes keys and values as text by default, so its batches need no options:
 * abstract-level copies a batch's options into every operation (`{...options, ...op}`), which
 * costs V8 a few µs per operation, against a fraction of one with none.
 */
const TEXT = { keyEncoding: 'utf8', valueEncoding: 'utf8' } as const
/** The data directory's lock file (it keeps the holder's pid). */
const LOCK_FILE = 'paygate.lock'
const REPLAY_CHUNK = 1000

const decodeLogged = <T>(l: Logged): T | undefined => (l.value === undefined ? undefined : (JSON.parse(l.value) as T))

class LevelCollection<T> implements Collection<T> {
  readonly prefix: string
  constructor(
    readonly name: string,
    readonly sub: Sub<T>,
    private readonly store: LevelStore,
  ) {
    this.prefix = sub.prefix
  }
  async get(key: string): Promise<T | undefined> {
    const logged = this.store.logged(this.prefix + key)
    if (logged) return decodeLogged<T>(logged)
    return (await this.sub.get(key)) as T | undefined
  }
  async getMany(keys: string[]): Promise<(T | undefined)[]> {
    const out = new Array<T | undefined>(keys.length)
    const miss: string[] = []
    const missAt: number[] = []
    keys.forEach((key, i) => {
      const logged = this.store.logged(this.prefix + key)
      if (!logged) {
        miss.push(key)
        missAt.push(i)
      } else out[i] = decodeLogged<T>(logged)
    })
    if (miss.length) {
      for (const [j, v] of (await this.sub.getMany(miss)).entries()) out[missAt[j]!] = v as T | undefined
    }
    return out
  }
  put(key: string, value: T): Promise<void> {
    return this.store.batch([{ type: 'put', coll: this, key, value }])
  }
  del(key: string): Promise<void> {
    return this.store.batch([{ type: 'del', coll: this, key }])
  }
  async *entries(opts: RangeOptions = {}): AsyncIterable<[string, T]> {
    await this.store.settled()
    for await (const [k, v] of this.sub.iterator(opts)) yield [k as string, v as T]
  }
  async *keys(opts: RangeOptions = {}): AsyncIterable<string> {
    await this.store.settled()
    for await (const k of this.sub.keys(opts)) yield k as string
  }
}

export class LevelStore implements Store {
  readonly backend = 'level' as const
  private readonly db: Level<string, unknown>
  private readonly colls = new Map<string, LevelCollection<unknown>>()
  private readonly locks = new KeyedMutex()
  private readonly initLock = new KeyedMutex()
  private writes!: WriteBehind
  private closed?: Promise<void>
  /** This process's lock on the data directory, released by `close`. */
  private lock?: FileLock
  /** What opening replayed from the log of the last run. */
  recovered = { batches: 0, torn: 0 }

  private constructor(readonly location: string) {
    this.db = new Level<string, unknown>(location, TEXT)
  }

  /** Open (creating if needed) the LevelDB under `<dataDir>/state` and its log under `<dataDir>/wal`. */
  static async open(dataDir: string, opts: StoreOptions = {}): Promise<LevelStore> {
    makeDataDir(dataDir)
    let lock: FileLock
    try {
      lock = lockFile(join(dataDir, LOCK_FILE), `the data directory ${dataDir}`)
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code
      // Not held by another Paygate: this process may not write there.
      if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') throw unusableDir(dataDir, e)
      throw new PaygateError('unavailable', `${(e as Error).message}; stop that Paygate or choose another data directory (dataDir, PAYGATE_DATA_DIR)`)
    }
    const store = new LevelStore(join(dataDir, 'state'))
    store.lock = lock
    try {
      await store.db.open()
      const walDir = join(dataDir, 'wal')
      const { files, batches, torn } = Wal.recover(walDir)
      // LevelDB may already hold some of these: re-applying them in order ends in the same state.
      for (let i = 0; i < batches.length; i += REPLAY_CHUNK) {
        await store.db.batch(levelOps(batches.slice(i, i + REPLAY_CHUNK).flat()) as never, { ...TEXT, sync: true } as never)
      }
      store.recovered = { batches: batches.length, torn }
      const wal = Wal.start(walDir, files, opts.walMaxBytes ?? 16 * 2 ** 20)
      store.writes = new WriteBehind(store.db as unknown as TextBatches, wal, opts.applyDelayMs ?? APPLY_DELAY_MS, opts.onApplyError ?? (() => {}))
    } catch (e) {
      if (store.db.status === 'open') await store.db.close()
      lock.release()
      throw e
    }
    return store
  }

  get status(): string {
    return this.writes.closing ? 'closing' : this.db.status
  }

  collection<T>(name: string): Collection<T> {
    // One collection a name, and every caller of a name reads it as the same T.
    let c = this.colls.get(name) as LevelCollection<T> | undefined
    if (!c) {
      const sub = this.db.sublevel<string, T>(name, { valueEncoding: 'json' }) as unknown as Sub<T>
      c = new LevelCollection<T>(name, sub, this)
      this.colls.set(name, c)
    }
    return c
  }

  /**
   * Every stored entry as [collection, key, JSON text] in LevelDB order (collections grouped),
   * once what is logged is in LevelDB: what `paygate copy-store` copies. Each collection is a
   * sublevel, stored under `!<name>!<key>` (abstract-level names use bytes 0x22-0x7e).
   */
  async *dump(): AsyncIterable<[string, string, string]> {
    await this.settled()
    for await (const [k, v] of this.db.iterator(TEXT as never) as AsyncIterable<[string, string]>) {
      const m = /^!([^!]+)!/.exec(k)
      if (!m) throw new Error(`store: a LevelDB key outside any collection (${JSON.stringify(k.slice(0, 40))})`)
      yield [m[1]!, k.slice(m[0].length), v]
    }
  }

  /** The logged state of a full key while it is not yet in LevelDB. */
  logged(key: string): Logged | undefined {
    return this.writes.logged(key)
  }

  /**
   * A read-modify-write of the state behind `key`, atomic in this process: `fn` runs while no
   * other transact() of `key` runs, and the operations it returns are enqueued as one batch
   * before the lock is released, so the next holder reads after them. The caller awaits
   * `written` outside the lock (the next decision need not wait for the disk). A database
   * backend implements the same with a row lock held until its batch commits.
   */
  async transact<T>(key: string, fn: (tx: Txn) => Promise<{ ops: readonly BatchOp[]; result: T }>): Promise<{ result: T; written: Promise<Result<void>> }> {
    return this.locks.run(key, async () => {
      let held: Map<string, Promise<() => void>> | undefined
      const tx: Txn = {
        also: async (other) => {
          if (other === key) return
          held ??= new Map()
          const got = held.get(other) ?? this.locks.acquire(other)
          held.set(other, got)
          await got
        },
      }
      try {
        const { ops, result } = await fn(tx)
        return { result, written: outcome(this.batch(ops as BatchOp[])) }
      } finally {
        if (held) for (const got of held.values()) void got.then((release) => release())
      }
    })
  }

  withInitLock<T>(fn: () => Promise<T>): Promise<T> {
    return this.initLock.run('init', fn)
  }

  /**
   * Apply puts and deletes across collections atomically; resolves once logged (see
   * `write-behind.ts`: staged and readable in a microtask, logged once a turn, written into
   * LevelDB behind the log). Batches land in the order `batch` was called. A batch that cannot
   * be encoded fails alone.
   */
  batch(ops: BatchOp[]): Promise<void> {
    return this.writes.batch(ops)
  }

  /** Resolves when LevelDB holds every batch made so far. */
  settled(): Promise<void> {
    return this.writes.settled()
  }

  /** The last LevelDB write error, while writes behind the log are being retried. */
  get applyError(): unknown {
    return this.writes.applyError
  }

  /** Write what is logged into LevelDB and close; the log is removed when LevelDB holds all of it. */
  close(): Promise<void> {
    this.closed ??= (async () => {
      const applied = await this.writes.finish()
      if (this.db.status === 'open' || this.db.status === 'opening') await this.db.close()
      this.writes.closeLog(applied)
      this.lock?.release()
    })()
    return this.closed
  }
}

const unusableDir = (dataDir: string, e: unknown): PaygateError =>
  new PaygateError('invalid_config', `the data directory ${dataDir} cannot be used: ${(e as Error).message} (dataDir, PAYGATE_DATA_DIR)`)

/** The data directory, made if missing (0700: it holds keys), or a refusal naming the setting (a file there, no permission). */
export function makeDataDir(dataDir: string): void {
  try {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 })
  } catch (e) {
    throw unusableDir(dataDir, e)
  }
}
