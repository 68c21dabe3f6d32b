import type { BatchOp, Collection, Store } from '../store/index.js'
import { deltaFromStore, storedDelta, type Delta, type StoredDelta } from './deltas.js'

/** How often what was counted is written (ms): its delta rows are deleted in that write, most of them before LevelDB sees them. */
export const CHECKPOINT_MS = 250

/** Where a record's write leaves its deltas until a checkpoint has counted them into the buckets. */
export const DELTA_COLLECTION = 'metricsDelta'

/** Adds deltas to memory, marking the buckets they change (after reading older buckets: a promise). */
export type Count = (deltas: Delta[]) => void | Promise<void>

/**
 * The aggregates' buckets on LevelDB, written behind the records (docs/metrics.md). A
 * record's batch carries its deltas as one small row (`op`); once that batch is logged they
 * are counted in memory and the buckets they changed are marked. Every CHECKPOINT_MS the
 * marked buckets (`collect`) are written in one batch that also deletes the delta rows counted
 * into them, so the stored buckets plus the delta rows left are always every logged change,
 * counted once. A start replays the rows a crash left (`replay`).
 *
 * The order holds because a row is counted only from its batch's `logged` callback (after the
 * log write, which runs on its own turn of the event loop), and a checkpoint takes its values
 * and its list of rows at once, when it is called.
 */
export class Checkpoints {
  readonly coll: Collection<StoredDelta[]>
  /** Deletes of pruned buckets, and the writes of a checkpoint that failed, for the next one. */
  private pending: BatchOp[] = []
  /** Delta rows counted in memory and not yet deleted by a checkpoint. */
  private unsaved: string[] = []
  private timer: NodeJS.Timeout | null = null
  private writing: Promise<void> = Promise.resolve()
  /** Counts waiting for older buckets to be read. */
  private readonly counting = new Set<Promise<void>>()
  private seq = 0
  /** Row keys are unique per run; a start deletes every row of the last one before anything is counted. */
  private readonly run = Date.now().toString(36)

  constructor(
    private readonly store: Store,
    /** The puts of every bucket marked since the last call (the marks are cleared). */
    private readonly collect: () => BatchOp[],
    private readonly onError: (e: unknown) => void,
    private readonly everyMs = CHECKPOINT_MS,
  ) {
    this.coll = store.collection<StoredDelta[]>(DELTA_COLLECTION)
  }

  /**
   * The row that carries `deltas` in a record's batch; `count` adds them to memory once that
   * batch is logged (when it must read older buckets first, it returns a promise: until it
   * settles the row is not counted, and stays).
   */
  op(deltas: Delta[], count: Count): BatchOp {
    const key = `${this.run}.${(this.seq++).toString(36)}`
    return { type: 'put', coll: this.coll as Collection<unknown>, key, value: deltas.map(storedDelta), fresh: true, logged: () => this.take(key, count(deltas)) }
  }

  private take(key: string, counting: void | Promise<void>): void {
    if (!counting) return this.counted(key)
    const p = counting.then(() => this.counted(key), this.onError).finally(() => this.counting.delete(p))
    this.counting.add(p)
  }

  /** Writes to make at the next checkpoint (the deletion of pruned buckets). */
  note(ops: readonly BatchOp[]): void {
    if (!ops.length) return
    this.pending.push(...ops)
    this.schedule()
  }

  private counted(key: string): void {
    this.unsaved.push(key)
    this.schedule()
  }

  private schedule(): void {
    if (this.timer) return
    this.timer = setTimeout(() => {
      this.timer = null
      void this.write()
    }, this.everyMs)
    this.timer.unref()
  }

  /** Write the buckets changed since the last checkpoint and delete the delta rows counted into them, in one batch; resolves once written (or failed: kept for the next one). */
  write(): Promise<void> {
    if (this.timer) {
      clearTimeout(this.timer)
      this.timer = null
    }
    if (!this.unsaved.length && !this.pending.length) return this.writing
    const rows = this.unsaved
    // Values now, with the list of rows: what is counted after this call is in neither. (A
    // failed checkpoint's writes come first: a later write of the same key wins.)
    const writes = [...this.pending, ...this.collect()]
    this.unsaved = []
    this.pending = []
    const ops: BatchOp[] = [...writes]
    for (const key of rows) ops.push({ type: 'del', coll: this.coll as Collection<unknown>, key })
    this.writing = this.store.batch(ops).catch((e: unknown) => {
      // Nothing of it is written: the next checkpoint writes it (memory still holds every count).
      this.unsaved = [...rows, ...this.unsaved]
      this.pending = [...writes, ...this.pending]
      // A closed store (a count that came in after the last checkpoint of a shutdown): its rows are replayed at the next start.
      if (this.store.status !== 'open') return
      this.schedule()
      this.onError(e)
    })
    return this.writing
  }

  /** Write everything counted so far, the counts still reading older buckets included (a clean stop). */
  async flush(): Promise<void> {
    await Promise.all(this.counting)
    await this.write()
  }

  /** At start, after the stored buckets are read: count the rows a crash left, then write a checkpoint. Returns how many rows. */
  async replay(count: Count): Promise<number> {
    let n = 0
    for await (const [key, stored] of this.coll.entries()) {
      await count(stored.map(deltaFromStore))
      this.counted(key)
      n++
    }
    if (n) await this.write()
    return n
  }
}
