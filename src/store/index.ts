import { LevelStore, makeDataDir } from './level.js'
import type { Store as StoreApi, StoreOptions } from './types.js'

export type { BatchOp, Collection, RangeOptions, StoreOptions, Txn } from './types.js'
export { LevelStore, makeDataDir }

/** The durable state, on whichever backend the config names (`store.postgresUrl`, else LevelDB). */
export type Store = StoreApi

export const Store = {
  /**
   * Open the store: PostgreSQL when `opts.postgresUrl` is set (its schema migrated first), else
   * LevelDB under `<dataDir>/state` with its log under `<dataDir>/wal`. The PostgreSQL backend
   * is loaded only when asked for, so the embedded default does not load the driver.
   */
  async open(dataDir: string, opts: StoreOptions = {}): Promise<Store> {
    if (opts.postgresUrl) {
      const { PostgresStore } = await import('./postgres.js')
      return PostgresStore.open(opts.postgresUrl, opts)
    }
    return LevelStore.open(dataDir, opts)
  },
}

/**
 * Run `fn` while no other `exclusive` or `transact` of `key` runs: in this process on LevelDB,
 * in every replica on PostgreSQL (the key's advisory lock is held for `fn`'s duration). `fn`
 * writes through the store as usual; its writes are committed before the lock is released,
 * so the next holder reads them. For short critical sections only: on PostgreSQL each holder
 * keeps a connection of the lock pool.
 */
export async function exclusive<T>(store: Store, key: string, fn: () => Promise<T>): Promise<T> {
  const { result } = await store.transact(key, async () => ({ ops: [], result: await fn() }))
  return result
}
