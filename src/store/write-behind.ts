import type { BatchOp } from './types.js'
import type { Wal, WalOp } from './wal.js'

/**
 * The LevelDB store's write path (`level.ts`): batches are staged (readable at once), logged
 * together once a turn of the event loop (group commit), and written into LevelDB behind the
 * log, several batches per write, a key written several times only in its last state.
 */

/**
 * How long a logged batch waits before it is written into LevelDB. A key it writes that a
 * batch logged meanwhile writes again is left to that batch: a paid record is rewritten when
 * its ledger record is confirmed, about 0.3-0.9 s later, and its outbox entry, pending-status
 * index and metrics delta are deleted again, so each payment reaches LevelDB about once.
 */
export const APPLY_DELAY_MS = 1000
/** Distinct keys per LevelDB write: encoding them is main-thread work, so a large backlog is written in slices. */
const APPLY_CHUNK = 512
/** How much of the log ripens between LevelDB writes, as a share of the delay: each write takes all of it, in slices. */
const APPLY_GATHER = 0.1

/** A logged value not yet in LevelDB (`value` undefined: deleted), with the batch that wrote it. */
export interface Logged {
  seq: number
  value: string | undefined
}

/** An encoded batch, numbered and readable, whose log write is still to come. */
interface Staged {
  seq: number
  ops: WalOp[]
  /** The batch's `logged` callbacks (null: none), called once its log write is done. */
  logged: (() => void)[] | null
  resolve: () => void
  reject: (e: unknown) => void
}

/** The `logged` callbacks of a batch's puts, or null (most batches have none). */
function loggedOf(ops: readonly BatchOp[]): (() => void)[] | null {
  let out: (() => void)[] | null = null
  for (const op of ops) if (op.type === 'put' && op.logged) (out ??= []).push(op.logged)
  return out
}

/** What the write path needs of LevelDB: a batch of text keys and values. */
export interface TextBatches {
  batch(ops: { type: 'put' | 'del'; key: string; value?: string }[]): Promise<void>
}

/** A batch this long or shorter is encoded op by op, without looking for keys it writes twice. */
const DEDUPE_FROM = 8

/** The full LevelDB key of an op: the collection's sublevel prefix and the key. */
const fullKey = (op: BatchOp): string => (op.coll as unknown as { prefix: string }).prefix + op.key

/** One op as logged: its full key and the value's JSON text. */
function encode(op: BatchOp, key: string): WalOp {
  if (op.type === 'del') return [key]
  const value = op.latest ? op.latest() : op.value
  if (value === null || value === undefined) throw new TypeError(`store: a put needs a value (${op.coll.name}/${op.key})`)
  return op.fresh ? [key, JSON.stringify(value), true] : [key, JSON.stringify(value)]
}

/**
 * A batch's ops as logged, a key written several times in it only in its last state: a batch
 * lands whole, so its last op on a key is all that counts. A group of paid records comes as
 * one batch in which every payment writes the same account buckets (metrics): each bucket is
 * encoded and logged once for the group.
 */
function encodeBatch(ops: readonly BatchOp[]): WalOp[] {
  if (ops.length <= DEDUPE_FROM) return ops.map((op) => encode(op, fullKey(op)))
  const keys = ops.map(fullKey)
  const last = new Map<string, number>()
  for (let i = 0; i < keys.length; i++) last.set(keys[i]!, i)
  if (last.size === keys.length) return ops.map((op, i) => encode(op, keys[i]!))
  const out: WalOp[] = []
  for (const [key, i] of last) out.push(encode(ops[i]!, key))
  return out
}

/** LevelDB's ops for `ops`; a key whose value is null has nothing to write (see `apply`). */
export function levelOps(ops: Iterable<readonly [key: string, value?: string | null, ...rest: unknown[]]>): { type: 'put' | 'del'; key: string; value?: string }[] {
  const out: { type: 'put' | 'del'; key: string; value?: string }[] = []
  for (const [key, value] of ops) if (value !== null) out.push(value === undefined ? { type: 'del', key } : { type: 'put', key, value })
  return out
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

export class WriteBehind {
  /** batches called in this tick, encoded together */
  private pending: { ops: readonly BatchOp[]; resolve: () => void; reject: (e: unknown) => void }[] = []
  private flushQueued = false
  /** encoded batches (readable in `overlay`) waiting for this turn's log write */
  private staged: Staged[] = []
  /** the slice being written into LevelDB, its keys' last values (null: nothing to write) and its last sequence number */
  private inApply: { merged: Map<string, string | undefined | null>; last: number } | null = null
  /** sequence number of the last staged (or logged) batch, and of the last one in LevelDB */
  private seq = 0
  private appliedSeq = 0
  /** sequence number of the last logged batch */
  private loggedSeq = 0
  private readonly overlay = new Map<string, Logged>()
  /** logged batches not yet in LevelDB, with when they were logged (`performance.now()`) */
  private toApply: { seq: number; ops: WalOp[]; at: number }[] = []
  /** Keys created by a fresh put that LevelDB has not been given: a newer logged state replaced it (see `apply`). */
  private readonly unwritten = new Set<string>()
  private applying = false
  private applyTimer: NodeJS.Timeout | null = null
  private waiters: { seq: number; resolve: () => void; reject: (e: unknown) => void }[] = []
  /** Set by `finish`: no batch is taken from then on. */
  closing = false
  /** The last LevelDB write error, while writes behind the log are being retried. */
  applyError: unknown

  constructor(
    private readonly db: TextBatches,
    private readonly wal: Wal,
    private readonly applyDelayMs: number,
    private readonly onApplyError: (e: unknown) => void,
  ) {}

  /** The logged (or staged) state of a full key while it is not yet in LevelDB. */
  logged(key: string): Logged | undefined {
    return this.overlay.get(key)
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
  batch(ops: readonly BatchOp[]): Promise<void> {
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
        ops = encodeBatch(b.ops)
      } catch (e) {
        b.reject(e)
        continue
      }
      const seq = ++this.seq
      for (const [key, value] of ops) this.overlay.set(key, { seq, value })
      this.staged.push({ seq, ops, logged: loggedOf(b.ops), resolve: b.resolve, reject: b.reject })
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
    this.loggedSeq = group[group.length - 1]!.seq
    const at = performance.now()
    for (const b of group) {
      this.toApply.push({ seq: b.seq, ops: b.ops, at })
      if (b.logged) for (const f of b.logged) f()
      b.resolve()
    }
    // A range read that began while these were staged waits for them.
    this.scheduleApply(this.waiters.length > 0)
  }

  /**
   * Take staged values of the keys `left` back (the set is used up): each reads as its newest
   * logged value not yet in LevelDB, else as LevelDB has it (no entry). A rare path, so found by
   * one scan of what waits for LevelDB, where remembering each key's value as it was staged
   * cost every batch.
   */
  private unstage(left: Set<string>): void {
    for (let i = this.toApply.length - 1; i >= 0 && left.size; i--) {
      const b = this.toApply[i]!
      for (let j = b.ops.length - 1; j >= 0; j--) {
        const [key, value] = b.ops[j]!
        if (left.delete(key)) this.overlay.set(key, { seq: b.seq, value })
      }
    }
    for (const key of left) {
      if (this.inApply?.merged.has(key)) this.overlay.set(key, { seq: this.inApply.last, value: this.inApply.merged.get(key) ?? undefined })
      else this.overlay.delete(key)
    }
  }

  /**
   * Start writing into LevelDB when the oldest logged batch is `applyDelayMs` old and a tenth
   * of that more has ripened (a write a turn would cost more per key), or `now` (someone waits).
   */
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
    else this.applyTimer = setTimeout(start, Math.max(0, this.toApply[0]!.at + (1 + APPLY_GATHER) * this.applyDelayMs - performance.now()))
  }

  /**
   * Take out of `merged` the keys a logged batch after `last` writes again (that batch's slice
   * writes them), unless a range read waits: it must find LevelDB holding each key as of the
   * batch it waits for. A range read that begins later waits for those newer batches too. Keys
   * LevelDB does not have (created fresh in the slice, or `unwritten`) are returned: still
   * absent from it afterwards. A newer batch only staged is not counted, as its log write may fail.
   */
  private supersede(merged: Map<string, string | undefined | null>, last: number, created: Set<string>): string[] {
    const absent: string[] = []
    if (this.waiters.length || this.closing) return absent
    for (const key of merged.keys()) {
      const seq = this.overlay.get(key)?.seq ?? 0
      if (seq <= last || seq > this.loggedSeq) continue
      merged.delete(key)
      if (created.has(key) || this.unwritten.has(key)) absent.push(key)
    }
    return absent
  }

  /**
   * Write what is logged into LevelDB once `applyDelayMs` old (at once when someone waits):
   * up to APPLY_CHUNK ops per write, a key written several times only in its last state, a
   * key written again by a newer logged batch not at all (`supersede`). Retried until it works
   * or the store closes.
   */
  private async apply(): Promise<void> {
    while (this.toApply.length) {
      const ripe = this.waiters.length || this.closing ? Number.POSITIVE_INFINITY : performance.now() - this.applyDelayMs
      if (this.toApply[0]!.at > ripe) break
      // A slice is counted in distinct keys: batches that rewrite the same keys share one. A key
      // created in the slice (a fresh put) and deleted again in it has nothing to write (null):
      // a pending payment's status index entries, a ledger record's outbox entry.
      const merged = new Map<string, string | undefined | null>()
      const created = new Set<string>()
      let n = 0
      while (n < this.toApply.length && this.toApply[n]!.at <= ripe && (n === 0 || merged.size + this.toApply[n]!.ops.length <= APPLY_CHUNK)) {
        for (const [key, value, fresh] of this.toApply[n++]!.ops) {
          merged.set(key, value === undefined && (created.has(key) || this.unwritten.has(key)) ? null : value)
          if (fresh) created.add(key)
        }
      }
      const group = this.toApply.splice(0, n)
      const last = group[group.length - 1]!.seq
      const absent = this.supersede(merged, last, created)
      this.inApply = { merged, last }
      for (let delay = 50; ; delay = Math.min(2 * delay, 2000)) {
        try {
          await this.db.batch(levelOps(merged))
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
      for (const key of merged.keys()) {
        this.unwritten.delete(key)
        if (this.overlay.get(key)!.seq <= last) this.overlay.delete(key)
      }
      for (const key of absent) this.unwritten.add(key)
      this.wal.retire(last)
      this.release(last)
      // Other work runs between slices, unless someone waits for them.
      if (this.waiters.length || this.closing) continue
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

  /**
   * Log what is staged, stop taking batches and write everything into LevelDB; resolves
   * whether LevelDB then holds all of it (the log can go). The log stays open: `closeLog`.
   */
  async finish(): Promise<boolean> {
    if (this.pending.length) this.stage()
    this.commit()
    this.closing = true
    return this.settled().then(
      () => true,
      () => false,
    )
  }

  /** Close the log; with `applied`, everything in it is in LevelDB and its files are removed. */
  closeLog(applied: boolean): void {
    this.wal.close(applied)
  }
}
