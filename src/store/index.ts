import { mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { Level } from 'level'

/**
 * LevelDB state (the `level` package lives only here). Each resource is a named
 * collection (a sublevel with JSON values); every multi-key change goes through
 * `batch`, which LevelDB applies atomically across collections.
 */
type Sub<T> = ReturnType<Level<string, unknown>['sublevel']> & { __t?: T }

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
  /** `latest`: the value is taken when the batch is written (the newest state of a key kept in memory). */
  | { type: 'put'; coll: Collection<any>; key: string; value: unknown; latest?: () => unknown }
  | { type: 'del'; coll: Collection<any>; key: string }

class LevelCollection<T> implements Collection<T> {
  constructor(
    readonly name: string,
    readonly sub: Sub<T>,
  ) {}
  async get(key: string): Promise<T | undefined> {
    return (await this.sub.get(key)) as T | undefined
  }
  async getMany(keys: string[]): Promise<(T | undefined)[]> {
    return (await this.sub.getMany(keys)) as (T | undefined)[]
  }
  async put(key: string, value: T): Promise<void> {
    await this.sub.put(key, value)
  }
  async del(key: string): Promise<void> {
    await this.sub.del(key)
  }
  async *entries(opts: RangeOptions = {}): AsyncIterable<[string, T]> {
    for await (const [k, v] of this.sub.iterator(opts)) yield [k as string, v as T]
  }
  async *keys(opts: RangeOptions = {}): AsyncIterable<string> {
    for await (const k of this.sub.keys(opts)) yield k as string
  }
}

function levelOp(op: BatchOp) {
  const sublevel = (op.coll as LevelCollection<unknown>).sub
  return op.type === 'put'
    ? { type: 'put' as const, sublevel, key: op.key, value: op.latest ? op.latest() : op.value }
    : { type: 'del' as const, sublevel, key: op.key }
}

export class Store {
  private readonly db: Level<string, unknown>
  private readonly colls = new Map<string, LevelCollection<any>>()
  private queue: { ops: BatchOp[]; resolve: () => void; reject: (e: unknown) => void }[] = []
  private writing = false

  private constructor(readonly location: string) {
    this.db = new Level<string, unknown>(location, { valueEncoding: 'json' })
  }

  /** Open (creating if needed) the LevelDB under `<dataDir>/state`. */
  static async open(dataDir: string): Promise<Store> {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 })
    const store = new Store(join(dataDir, 'state'))
    await store.db.open()
    return store
  }

  get status(): string {
    return this.db.status
  }

  collection<T>(name: string): Collection<T> {
    let c = this.colls.get(name)
    if (!c) {
      const sub = this.db.sublevel<string, T>(name, { valueEncoding: 'json' }) as unknown as Sub<T>
      c = new LevelCollection<T>(name, sub)
      this.colls.set(name, c)
    }
    return c
  }

  /**
   * Apply puts and deletes across collections atomically. Batches are written one LevelDB
   * write at a time, in the order `batch` was called (concurrent calls are grouped into one
   * write), so a key's later state never lands before an earlier one.
   */
  batch(ops: BatchOp[]): Promise<void> {
    if (!ops.length) return Promise.resolve()
    return new Promise((resolve, reject) => {
      this.queue.push({ ops, resolve, reject })
      if (!this.writing) void this.drain()
    })
  }

  private async drain(): Promise<void> {
    this.writing = true
    while (this.queue.length) {
      const group = this.queue.splice(0, this.queue.length)
      try {
        await this.db.batch(group.flatMap((g) => g.ops.map(levelOp)) as never)
        for (const g of group) g.resolve()
      } catch (e) {
        // One bad batch must not fail the others grouped with it: write them one by one.
        if (group.length === 1) group[0]!.reject(e)
        else for (const g of group) await this.db.batch(g.ops.map(levelOp) as never).then(g.resolve, g.reject)
      }
    }
    this.writing = false
  }

  async close(): Promise<void> {
    while (this.writing) await new Promise((r) => setImmediate(r))
    if (this.db.status === 'open' || this.db.status === 'opening') await this.db.close()
  }
}
