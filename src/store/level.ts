import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { Level } from 'level'
import { PaygateError } from '../errors/index.js'
import { lockFile, type FileLock } from '../util/file-lock.js'
import { KeyedMutex } from '../util/mutex.js'
import { outcome, type Result } from '../util/result.js'
import type { BatchOp, Collection, RangeOptions, Store, StoreOptions, Txn } from './types.js'
import { Wal, type WalOp } from './wal.js'

/**
 * LevelDB state (the `level` package lives only here). Each resource is a named
 * collection (a sublevel with JSON values); every multi-key change goes through
 * `batch`, which is atomic across collections.
 *
 * A batch is durable when its record is in the write-ahead log (`wal.ts`, one `writeSync` for
 * all the batches of a turn of the event loop); LevelDB is written behind it, several batches
 * per write. Until then point reads (`get`, `getMany`) are answered from the logged (or
 * staged) values, and range reads wait until LevelDB holds every batch made before they
 * began. Opening replays the log into LevelDB.
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
/**
 * How long logged batches wait to be written into LevelDB. A paid record is rewritten when its
 * ledger record is confirmed, about 0.3-0.9 s later, and its outbox entry deleted: a second
 * apart, the two writes of each mostly land in one slice (one put, a delete instead of a put).
 */
const APPLY_DELAY_MS = 1000
/** Distinct keys per LevelDB write: encoding them is main-thread work, so a large backlog is written in slices. */
const APPLY_CHUNK = 512

/** A logged value not yet in LevelDB (`value` undefined: deleted), with the batch that wrote it. */
interface Logged {
  seq: number
  value: string | undefined
}

/** An encoded batch, numbered and readable, whose log write is still to come. */
interface Staged {
  seq: number
  ops: WalOp[]
  resolve: () => void
  reject: (e: unknown) => void
}

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

/** One op as logged: the full LevelDB key and the value's JSON text. */
function encode(op: BatchOp): WalOp {
  const key = (op.coll as LevelCollection<unknown>).prefix + op.key
  if (op.type === 'del') return [key]
  const value = op.latest ? op.latest() : op.value
  if (value === null || value === undefined) throw new TypeError(`store: a put needs a value (${op.coll.name}/${op.key})`)
  return [key, JSON.stringify(value)]
}

function levelOps(ops: Iterable<WalOp>): { type: 'put' | 'del'; key: string; value?: string }[] {
  const out: { type: 'put' | 'del'; key: string; value?: string }[] = []
  for (const [key, value] of ops) out.push(value === undefined ? { type: 'del', key } : { type: 'put', key, value })
  return out
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

export class LevelStore implements Store {
  readonly backend = 'level' as const
  private readonly db: Level<string, unknown>
  private readonly colls = new Map<string, LevelCollection<unknown>>()
  private readonly locks = new KeyedMutex()
  private readonly initLock = new KeyedMutex()
  private wal!: Wal
  /** batches called in this tick, encoded together */
  private pending: { ops: BatchOp[]; resolve: () => void; reject: (e: unknown) => void }[] = []
  private flushQueued = false
  /** encoded batches (readable in `overlay`) waiting for this turn's log write */
  private staged: Staged[] = []
  /** the slice being written into LevelDB, its keys' last values and its last sequence number */
  private inApply: { merged: Map<string, string | undefined>; last: number } | null = null
  /** sequence number of the last staged (or logged) batch, and of the last one in LevelDB */
  private seq = 0
  private appliedSeq = 0
  private readonly overlay = new Map<string, Logged>()
  private toApply: { seq: number; ops: WalOp[] }[] = []
  private applying = false
  private applyTimer: NodeJS.Timeout | null = null
  private waiters: { seq: number; resolve: () => void; reject: (e: unknown) => void }[] = []
  private closing = false
  private closed?: Promise<void>
  /** This process's lock on the data directory, released by `close`. */
  private lock?: FileLock
  /** What opening replayed from the log of the last run. */
  recovered = { batches: 0, torn: 0 }
  /** The last LevelDB write error, while writes behind the log are being retried. */
  applyError: unknown

  private constructor(
    readonly location: string,
    private readonly applyDelayMs: number,
    private readonly onApplyError: (e: unknown) => void,
  ) {
    this.db = new Level<string, unknown>(location, TEXT)
  }

  /** Open (creating if needed) the LevelDB under `<dataDir>/state` and its log under `<dataDir>/wal`. */
  static async open(dataDir: string, opts: StoreOptions = {}): Promise<LevelStore> {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 })
    let lock: FileLock
    try {
      lock = lockFile(join(dataDir, LOCK_FILE), `the data directory ${dataDir}`)
    } catch (e) {
      throw new PaygateError('unavailable', `${(e as Error).message}; stop that Paygate or choose another data directory (dataDir, PAYGATE_DATA_DIR)`)
    }
    const store = new LevelStore(join(dataDir, 'state'), opts.applyDelayMs ?? APPLY_DELAY_MS, opts.onApplyError ?? (() => {}))
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
      store.wal = Wal.start(walDir, files, opts.walMaxBytes ?? 16 * 2 ** 20)
    } catch (e) {
      if (store.db.status === 'open') await store.db.close()
      lock.release()
      throw e
    }
    return store
  }

  get status(): string {
    return this.closing ? 'closing' : this.db.status
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
    return this.overlay.get(key)
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
   * Apply puts and deletes across collections atomically. Resolves once logged; batches are
   * logged and applied in the order `batch` was called, so a key's later state never lands
   * before an earlier one. A batch that cannot be encoded fails alone.
   *
   * Group commit: the batches of a tick are encoded in a microtask and readable from then on
   * (a `transact` holder's successor reads its write), and every batch staged in this turn of
   * the event loop (under load, the callbacks of every socket ready at once) shares one log
   * write, after those callbacks. If that write fails, each of its batches fails and what they
   * staged is taken back.
   */
  batch(ops: BatchOp[]): Promise<void> {
    if (!ops.length) return Promise.resolve()
    if (this.closing) return Promise.reject(new Error('store: closed'))
    return new Promise((resolve, reject) => {
      this.pending.push({ ops, resolve, reject })
      if (!this.flushQueued) {
        this.flushQueued = true
        queueMicrotask(() => this.stage())
      }
    })
  }

  /** Encode this tick's batches, number them and make them readable; the log write follows this turn. */
  private stage(): void {
    this.flushQueued = false
    const group = this.pending.splice(0, this.pending.length)
    const first = !this.staged.length
    for (const b of group) {
      let ops: WalOp[]
      try {
        ops = b.ops.map(encode)
      } catch (e) {
        b.reject(e)
        continue
      }
      const seq = ++this.seq
      for (const [key, value] of ops) this.overlay.set(key, { seq, value })
      this.staged.push({ seq, ops, resolve: b.resolve, reject: b.reject })
    }
    if (first && this.staged.length) setImmediate(() => this.commit())
  }

  /** Log every staged batch in one write, then acknowledge them. */
  private commit(): void {
    const group = this.staged
    if (!group.length) return
    this.staged = []
    try {
      this.wal.append(
        group.map((b) => b.ops),
        group[group.length - 1]!.seq,
      )
    } catch (e) {
      // Nothing of this group is logged: its values leave the overlay and its numbers are reused.
      this.seq = group[0]!.seq - 1
      this.unstage(new Set(group.flatMap((b) => b.ops.map(([key]) => key))))
      for (const w of this.waiters) w.seq = Math.min(w.seq, this.seq)
      this.release(this.appliedSeq)
      for (const b of group) b.reject(e)
      return
    }
    for (const b of group) {
      this.toApply.push({ seq: b.seq, ops: b.ops })
      b.resolve()
    }
    // A range read that began while these were staged waits for them.
    this.scheduleApply(this.waiters.length > 0)
  }

  /**
   * Take staged values of `keys` back: each reads as its newest logged value not yet in LevelDB,
   * else as LevelDB has it (no entry). A rare path, so found by one scan of what waits for
   * LevelDB, where remembering each key's value as it was staged cost every batch.
   */
  private unstage(keys: Set<string>): void {
    const left = new Set(keys)
    for (let i = this.toApply.length - 1; i >= 0 && left.size; i--) {
      const b = this.toApply[i]!
      for (let j = b.ops.length - 1; j >= 0; j--) {
        const [key, value] = b.ops[j]!
        if (left.delete(key)) this.overlay.set(key, { seq: b.seq, value })
      }
    }
    for (const key of left) {
      if (this.inApply?.merged.has(key)) this.overlay.set(key, { seq: this.inApply.last, value: this.inApply.merged.get(key) })
      else this.overlay.delete(key)
    }
  }

  /** Start writing into LevelDB after `applyDelayMs`, or `now` (someone waits for it). */
  private scheduleApply(now: boolean): void {
    if (this.applying || !this.toApply.length) return
    if (now && this.applyTimer) {
      clearTimeout(this.applyTimer)
      this.applyTimer = null
    }
    if (this.applyTimer) return
    const start = (): void => {
      this.applyTimer = null
      this.applying = true
      void this.apply()
    }
    if (now) start()
    else this.applyTimer = setTimeout(start, this.applyDelayMs)
  }

  /**
   * Write what is logged into LevelDB: up to APPLY_CHUNK ops per write, a key written
   * several times only in its last state. Retried until it works or the store closes.
   */
  private async apply(): Promise<void> {
    while (this.toApply.length) {
      // A slice is counted in distinct keys: batches that rewrite the same keys share one.
      const merged = new Map<string, string | undefined>()
      let n = 0
      while (n < this.toApply.length && (n === 0 || merged.size + this.toApply[n]!.ops.length <= APPLY_CHUNK)) {
        for (const [key, value] of this.toApply[n++]!.ops) merged.set(key, value)
      }
      const group = this.toApply.splice(0, n)
      const last = group[group.length - 1]!.seq
      this.inApply = { merged, last }
      for (let delay = 50; ; delay = Math.min(2 * delay, 2000)) {
        try {
          await this.db.batch(levelOps(merged) as never)
          if (this.applyError !== undefined) this.onApplyError(undefined)
          this.applyError = undefined
          break
        } catch (e) {
          if (this.applyError === undefined) this.onApplyError(e)
          this.applyError = e
          if (this.closing) {
            this.toApply.unshift(...group)
            this.inApply = null
            this.applying = false
            for (const w of this.waiters.splice(0)) w.reject(e)
            return
          }
          await sleep(delay)
        }
      }
      this.appliedSeq = last
      this.inApply = null
      for (const key of merged.keys()) if (this.overlay.get(key)!.seq <= last) this.overlay.delete(key)
      this.wal.retire(last)
      this.release(last)
      // What was logged meanwhile waits its own delay, unless someone waits for it or a
      // backlog of a full slice or more has built up (then other work runs between slices).
      if (this.waiters.length || this.closing) continue
      if (this.toApply.reduce((k, b) => k + b.ops.length, 0) < APPLY_CHUNK) break
      await new Promise((r) => setImmediate(r))
    }
    this.applying = false
    this.scheduleApply(false)
  }

  /** Resolve the range reads waiting for batches up to `applied`. */
  private release(applied: number): void {
    if (!this.waiters.length) return
    this.waiters = this.waiters.filter((w) => {
      if (w.seq > applied) return true
      w.resolve()
      return false
    })
  }

  /** Resolves when LevelDB holds every batch made so far (one whose log write fails counts as held). */
  settled(): Promise<void> {
    const seq = this.seq
    if (this.appliedSeq >= seq) return Promise.resolve()
    return new Promise((resolve, reject) => {
      this.waiters.push({ seq, resolve, reject })
      this.scheduleApply(true)
    })
  }

  /** Write what is logged into LevelDB and close; the log is removed when LevelDB holds all of it. */
  close(): Promise<void> {
    this.closed ??= (async () => {
      if (this.pending.length) this.stage()
      this.commit()
      this.closing = true
      const applied = await this.settled().then(
        () => true,
        () => false,
      )
      if (this.db.status === 'open' || this.db.status === 'opening') await this.db.close()
      this.wal.close(applied)
      this.lock?.release()
    })()
    return this.closed
  }
}
