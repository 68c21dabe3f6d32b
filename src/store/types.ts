import type { Result } from '../util/result.js'

/**
 * What every durable thing is written through: named collections of JSON values and atomic
 * batches across them. Two backends implement it: LevelDB (`level.ts`, the embedded default)
 * and PostgreSQL (`postgres.ts`, shared by replicas). Keys compare as UTF-8 bytes in both.
 */
export interface Collection<T> {
  readonly name: string
  get(key: string): Promise<T | undefined>
  getMany(keys: string[]): Promise<(T | undefined)[]>
  put(key: string, value: T): Promise<void>
  del(key: string): Promise<void>
  /** Entries in key order; `gt`/`lt` bound the range, `reverse` walks backwards. */
  entries(opts?: RangeOptions): AsyncIterable<[string, T]>
  keys(opts?: RangeOptions): AsyncIterable<string>
}

export interface RangeOptions {
  gt?: string
  gte?: string
  lt?: string
  lte?: string
  reverse?: boolean
  limit?: number
}

export type BatchOp =
  /**
   * `latest`: the value is taken when the batch is logged (the newest state of a key kept in memory).
   * `fresh`: the writer knows the key was never written before (a new record's index entry, a
   * new nonce): deleted again before it reaches LevelDB, it is not written there at all.
   * `logged`: called once the batch is durable (LevelDB: in the log; PostgreSQL: committed),
   * before `batch` resolves, in the order batches are written; never if it fails. It must not throw.
   */
  { type: 'put'; coll: Collection<unknown>; key: string; value: unknown; latest?: () => unknown; fresh?: boolean; logged?: () => void } | { type: 'del'; coll: Collection<unknown>; key: string }

/** What a transact() section can do besides reading and returning its batch. */
export interface Txn {
  /**
   * Hold `key`'s lock too until this section's batch is written (PostgreSQL: `key`'s advisory
   * lock on the same transaction, so no second connection; LevelDB: this process's lock of
   * `key`). Take locks in one order everywhere (an agent's usage before an invocation tree),
   * so two sections never wait on each other.
   */
  also(key: string): Promise<void>
}

export interface StoreOptions {
  /** Start a new write-ahead log file past this size (bytes). Default 16 MiB. */
  walMaxBytes?: number
  /**
   * How long logged batches wait before they are written into LevelDB (ms), so one write
   * carries many of them and a key rewritten meanwhile is written once (an agent's usage, the
   * outbox nonce, the metrics buckets, a record going from pending to paid and confirmed). Default 1000.
   */
  applyDelayMs?: number
  /** Told when writing into LevelDB starts failing (it is retried) and when it works again (`undefined`). */
  onApplyError?: (e: unknown) => void
  /** Keep the state in this PostgreSQL database instead of LevelDB (`store.postgresUrl`). */
  postgresUrl?: string
  /** Most connections the PostgreSQL backend opens. Default 10. */
  postgresPoolSize?: number
}

export interface Store {
  readonly backend: 'level' | 'postgres'
  /** `open` while it serves reads and writes. */
  readonly status: string
  /** What opening replayed from the write-ahead log of the last run (LevelDB; zeros on PostgreSQL). */
  readonly recovered: { batches: number; torn: number }
  /** The last write error while writes are being retried (LevelDB) or the database is unreachable (PostgreSQL). */
  readonly applyError: unknown
  /** One collection a name, and every caller of a name reads it as the same T. */
  collection<T>(name: string): Collection<T>
  /**
   * A read-modify-write of the state behind `key`: `fn` runs while no other transact() of
   * `key` runs (in this process on LevelDB; in every process on the database on PostgreSQL),
   * and the operations it returns are written as one batch ordered before the next holder's
   * reads. `written` tells whether the batch was written.
   */
  transact<T>(key: string, fn: (tx: Txn) => Promise<{ ops: readonly BatchOp[]; result: T }>): Promise<{ result: T; written: Promise<Result<void>> }>
  /**
   * Run one-time setup (the first account key, the master key check, the chain signer)
   * holding the initialisation lock: on PostgreSQL a session advisory lock every replica
   * takes, so replicas starting together set up once and the later ones find it done; on
   * LevelDB one process owns the data directory, so a lock in this process.
   */
  withInitLock<T>(fn: () => Promise<T>): Promise<T>
  /** Apply puts and deletes across collections atomically, in the order `batch` was called. */
  batch(ops: BatchOp[]): Promise<void>
  /** Resolves once every batch acknowledged so far is in the backend's own storage (LevelDB behind its log; at once where a batch is written in place). */
  settled(): Promise<void>
  close(): Promise<void>
}
