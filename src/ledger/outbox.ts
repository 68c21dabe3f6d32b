import { channels } from '../events/channels.js'
import type { Hex } from 'viem'
import type { LedgerEntry, LedgerWriter } from '../chain/ledger-tx.js'
import type { Logger } from '../log/index.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import { KeyedMutex } from '../util/mutex.js'
import { minedInOrder, NONCE_KEY, nonceKey, type OutboxEntry } from './outbox-receipts.js'
import { SharedOutbox } from './outbox-shared.js'
import { RecordSigning } from './record-signing.js'
import type { Transactions } from './transactions.js'
import { systemClock, type Clock } from '../util/clock.js'

interface QueuedRecord {
  entry: LedgerEntry
  txId: string
  ops: (hash: Hex) => BatchOp[]
  resolve: (h: Hex) => void
  reject: (e: unknown) => void
  /** Shared store: checked under the signer's lock before a nonce is taken; false drops the record (`superseded`). */
  still?: () => Promise<boolean>
}

/**
 * How long records gather before a pass sends them (in one call): passes cost per call, not per
 * record, on both sides. Nothing waits for it: the paid path has its txHash already.
 */
const SEND_DELAY_MS = 100
/** At most this many records per send call (a backlog after a restart goes in slices). */
const MAX_SEND = 1000
/**
 * At most this many records held in memory (about 0.5 KB each). A longer backlog (a chain
 * that is down while payments go on) waits in the store only, and is read back in nonce
 * order as the held records are confirmed.
 */
const MAX_HELD = 20_000
/**
 * A record sent this long ago with no receipt is sent again, with those after it: a node may
 * drop a transaction from its pool (a restart, eviction), and nothing after it can be mined.
 * Sending again what the node has is harmless ("already known").
 */
const RESEND_AFTER_MS = 60_000

/**
 * Durable outbox of ledger records. A record is signed with the next local nonce and
 * stored (raw transaction and hash) in the same LevelDB batch as the payment record, so
 * the ledger `txHash` is known at once and survives a crash; a background pump sends the
 * stored transactions in nonce order and marks them confirmed when their receipts arrive.
 * The paid path never waits for the chain.
 *
 * What is stored is also held in memory (read once at start, up to MAX_HELD), so a pump pass
 * reads nothing back: a range read would make the store write everything logged into LevelDB
 * first, many times a second under load.
 */
export class Outbox {
  private readonly entries: Collection<OutboxEntry>
  private readonly meta: Collection<string>
  private readonly lock = new KeyedMutex()
  private nextNonce = 0n
  /** Stored and not yet sent, then sent and not yet confirmed; both in nonce order. */
  private unsent: OutboxEntry[] = []
  private unconfirmed: OutboxEntry[] = []
  /** Records in the store, held or not. */
  private stored = 0
  /** The nonce after the last record taken into memory. */
  private nextHeld = 0n
  /** While records up to (not including) this nonce wait in the store only. */
  private spilledUpTo: bigint | null = null
  private rerun = false
  /** When each unconfirmed record was last sent (by hash), and first sent (by transaction id: resends keep it). */
  private readonly sentAt = new Map<string, number>()
  private readonly firstSentAt = new Map<string, number>()
  private timer: NodeJS.Timeout | null = null
  private pumping: Promise<void> | null = null
  private closed = false
  private readonly queue: QueuedRecord[] = []
  /** Which transaction each record gets: one made ahead, or its group's. */
  private readonly signing: RecordSigning

  /** On a store shared by replicas (PostgreSQL): nonces from the database, other replicas' rows adopted (outbox-shared.ts). */
  private readonly shared: SharedOutbox | null

  private readonly pollMs: number
  private readonly maxHeld: number
  private readonly resendAfterMs: number
  private readonly clock: Clock

  constructor(
    private readonly store: Store,
    private readonly transactions: Transactions,
    private readonly writer: LedgerWriter,
    private readonly log: Logger,
    opts: { pollMs?: number; maxHeld?: number; resendAfterMs?: number; clock?: Clock } = {},
  ) {
    this.pollMs = opts.pollMs ?? 100
    this.maxHeld = opts.maxHeld ?? MAX_HELD
    this.resendAfterMs = opts.resendAfterMs ?? RESEND_AFTER_MS
    this.clock = opts.clock ?? systemClock
    this.entries = store.collection('ledgerOutbox')
    this.meta = store.collection('meta')
    this.shared = store.backend === 'postgres' ? new SharedOutbox(store, this.entries, this.meta, this.clock, log) : null
    this.signing = new RecordSigning(writer)
  }

  async start(): Promise<void> {
    const chainNonce = await this.writer.init()
    if (this.shared) this.shared.chainNonce = chainNonce
    const stored = await this.meta.get(NONCE_KEY)
    this.nextNonce = stored !== undefined && BigInt(stored) > chainNonce ? BigInt(stored) : chainNonce
    // After a restart everything stored is sent again: the node may never have had it.
    this.nextHeld = this.nextNonce
    for await (const [, e] of this.entries.entries({ limit: this.maxHeld })) this.hold([e])
    this.stored = this.unsent.length
    // Past the cap only keys are read, to count the backlog and see where it ends.
    if (this.stored === this.maxHeld) {
      for await (const k of this.entries.keys({ gte: nonceKey(this.nextHeld) })) {
        this.stored++
        this.spilledUpTo = BigInt(k) + 1n
      }
    }
    this.schedule(0)
  }

  /** How many records are waiting to be sent or confirmed. */
  pending(): number {
    return this.stored
  }

  /** Since when (ms ago) the oldest unconfirmed record was first sent, or null: one that never gets a receipt holds every later one (GET /v1/health). */
  oldestWaitMs(): number | null {
    const first = this.unconfirmed[0]
    const at = first ? this.firstSentAt.get(first.txId) : undefined
    return at === undefined ? null : Math.max(0, this.clock.now() - at)
  }

  private held(): number {
    return this.unsent.length + this.unconfirmed.length
  }

  private hold(es: OutboxEntry[]): void {
    for (const e of es) this.unsent.push(e)
    this.nextHeld = BigInt(es[es.length - 1]!.nonce) + 1n
  }

  /** Take records that wait in the store only into memory, as far as there is room. */
  private async readBack(): Promise<void> {
    const room = this.maxHeld - this.held()
    if (room <= 0) return
    const got: OutboxEntry[] = []
    for await (const [, e] of this.entries.entries({ gte: nonceKey(this.nextHeld), limit: room })) got.push(e)
    if (got.length) this.hold(got)
    // Records stored during the read raised spilledUpTo: then the next pass reads them.
    if (this.nextHeld >= this.spilledUpTo!) this.spilledUpTo = null
  }

  /**
   * Sign the ledger record and write it together with `ops(hash)` (the caller's own
   * records) in one atomic batch. Returns the ledger transaction hash. Concurrent calls
   * are group-committed: consecutive nonces, one LevelDB batch.
   */
  record(entry: LedgerEntry, txId: string, ops: (hash: Hex) => BatchOp[]): Promise<Hex> {
    return this.enqueue({ entry, txId, ops })
  }

  private enqueue(r: Omit<QueuedRecord, 'resolve' | 'reject'>): Promise<Hex> {
    return new Promise<Hex>((resolve, reject) => {
      this.queue.push({ ...r, resolve, reject })
      if (this.queue.length === 1) queueMicrotask(() => void this.flush())
    })
  }

  /**
   * Sign `entry` while the caller waits on the network (the paid retry), with the nonce it
   * gets if it is the next record stored: when it is paid, record() finds the signature done,
   * a signature less on the paid path (RecordSigning.askAhead). Only when no record waits to be
   * stored: under load, nonces go in completion order and a guess would often be wrong.
   * A guess that does not hold (another record took the nonce, the fees changed, the
   * payment failed) is dropped unused; nothing signed ahead is stored or sent.
   */
  signAhead(entry: LedgerEntry): void {
    // Shared: the next nonce is another replica's as often as ours, a guess would rarely hold.
    if (this.closed || this.queue.length || this.shared) return
    this.signing.askAhead(entry, () => (this.closed || this.queue.length ? null : this.nextNonce))
  }

  private async flush(): Promise<void> {
    await this.lock.run('nonce', async () => {
      const group = this.queue.splice(0, this.queue.length)
      const batch: BatchOp[] = []
      const hashes: Hex[] = []
      const stored: OutboxEntry[] = []
      let nonce = this.nextNonce
      let kept = group
      try {
        if (this.shared) {
          ;({ next: nonce, kept } = await this.shared.record(group, batch, (k, from) => this.signGroup(k, from, batch, hashes, stored)))
        } else {
          nonce = await this.signGroup(group, nonce, batch, hashes, stored)
          await this.store.batch(batch)
        }
      } catch (e) {
        for (const g of group) g.reject(e)
        return
      }
      this.nextNonce = nonce
      this.signing.passed(nonce)
      this.stored += stored.length
      // Nothing stored when every record of the group was dropped (superseded).
      if (stored.length) {
        if (this.spilledUpTo === null && this.held() + stored.length <= this.maxHeld) this.hold(stored)
        else this.spilledUpTo = nonce
      }
      for (const [i, g] of kept.entries()) g.resolve(hashes[i]!)
      if (kept !== group) for (const g of group) if (!kept.includes(g)) g.reject(Object.assign(new Error('superseded'), { code: 'superseded' }))
    })
    // record() schedules a flush for whatever arrives meanwhile; the pass waits to send a run
    // of records and find the earlier ones mined, instead of one pass (and one receipt miss) per payment.
    this.schedule(SEND_DELAY_MS)
  }

  /** Sign the group from `nonce` on, adding its rows, the callers' ops and the next nonce to `batch`; the next nonce. */
  private async signGroup(group: readonly QueuedRecord[], nonce: bigint, batch: BatchOp[], hashes: Hex[], stored: OutboxEntry[]): Promise<bigint> {
    const sigs = await this.signing.signAll(
      group.map((g) => g.entry),
      nonce,
    )
    for (const [i, g] of group.entries()) {
      const signed = sigs[i]!
      const e: OutboxEntry = { nonce: nonce.toString(), txId: g.txId, raw: signed.raw, hash: signed.hash }
      stored.push(e)
      // A nonce is stored once (the next one is stored with it): its entry is fresh, and deleted within a second or so.
      batch.push({ type: 'put', coll: this.entries, key: nonceKey(nonce), value: e, fresh: true })
      batch.push(...g.ops(signed.hash))
      hashes.push(signed.hash)
      nonce++
    }
    batch.push({ type: 'put', coll: this.meta, key: NONCE_KEY, value: nonce.toString() })
    return nonce
  }

  private schedule(ms: number): void {
    if (this.closed || this.timer) return
    this.timer = setTimeout(() => {
      this.timer = null
      if (this.pumping) {
        // Records may have arrived after the running pass read its range: run again after it.
        this.rerun = true
        return
      }
      this.pumping = this.pump()
        .catch((e: unknown) => {
          this.log.warn({ err: e }, 'ledger outbox pump failed; retrying')
          this.rerun = true
        })
        .finally(() => {
          this.pumping = null
          if (this.rerun) {
            this.rerun = false
            this.schedule(this.pollMs)
          }
        })
    }, ms)
    this.timer.unref()
  }

  /** Send what is unsent (in nonce order, MAX_SEND per call), then confirm what has receipts. */
  private async pump(): Promise<void> {
    if (this.spilledUpTo !== null) await this.readBack()
    if (this.shared) await this.adoptForeign(this.shared)
    await this.writer.refreshFeesIfDue().catch((e: unknown) => this.log.warn({ err: e }, 'refreshing ledger fees failed; the last ones are used'))
    while (this.unsent.length) {
      const batch = this.unsent.slice(0, MAX_SEND)
      const r = await this.writer.broadcast(batch.map((e) => e.raw)).catch((e: unknown) => ({ sent: 0, error: e }))
      const sent = this.unsent.splice(0, r.sent)
      const now = this.clock.now()
      for (const e of sent) this.sentAt.set(e.hash, now)
      for (const e of sent) if (!this.firstSentAt.has(e.txId)) this.firstSentAt.set(e.txId, now)
      this.unconfirmed.push(...sent)
      if (r.error) throw r.error
    }
    const { confirmed, left } = await minedInOrder(this.unconfirmed, this.writer)
    // The pass's records in one read and every confirmation in one write (they are
    // idempotent: a crash only means the next pass redoes them).
    const prevs = await this.transactions.getMany(confirmed.map((c) => c.e.txId))
    const ops: BatchOp[] = []
    confirmed.forEach(({ e, r }, i) => {
      // A pinned record (an invocation root that may close meanwhile) is updated from its newest state.
      const prev = this.transactions.liveRecord(e.txId) ?? prevs[i]
      ops.push({ type: 'del', coll: this.entries, key: nonceKey(BigInt(e.nonce)) })
      if (prev) {
        const replaced = prev.ledger?.replacedTxHash ? { replacedTxHash: prev.ledger.replacedTxHash } : {}
        const ledger = r.success
          ? { status: 'confirmed' as const, blockNumber: r.blockNumber, ...replaced }
          : { status: 'failed' as const, blockNumber: r.blockNumber, error: 'ledger record reverted', ...replaced }
        ops.push(...this.transactions.ops({ ...prev, ledger }, prev))
        if (channels.ledgerConfirmed.hasSubscribers) channels.ledgerConfirmed.publish({ transactionId: prev.id, success: r.success, lagMs: Math.max(0, this.clock.now() - prev.updatedAt) })
      }
      if (!r.success) this.log.error({ txId: e.txId, hash: e.hash }, 'ledger record reverted')
    })
    await this.store.batch(ops)
    for (const { e } of confirmed) {
      this.sentAt.delete(e.hash)
      this.firstSentAt.delete(e.txId)
    }
    this.unconfirmed.splice(0, confirmed.length)
    this.stored -= confirmed.length
    const stuck = this.unconfirmed[0]
    if (stuck && this.clock.now() - (this.sentAt.get(stuck.hash) ?? 0) >= this.resendAfterMs) {
      if (await this.writer.nonceTaken(BigInt(stuck.nonce), stuck.hash)) {
        await this.replace(stuck)
        this.schedule(this.pollMs)
        return
      }
      this.log.warn({ txId: stuck.txId, hash: stuck.hash, waiting: this.unconfirmed.length }, 'a ledger record has no receipt long after it was sent; sending it and those after it again')
      this.unsent = [...this.unconfirmed.splice(0), ...this.unsent]
    }
    if (left || this.spilledUpTo !== null || this.unsent.length) this.schedule(this.pollMs)
  }

  /**
   * A record whose nonce another transaction from the signer's account took (someone sent from
   * that key) can never be mined, and holds every later record unconfirmed: it is recorded again
   * under the next nonce, its row replaced in the same batch, and the payment's record takes the
   * new ledger hash (the old one kept as `ledger.replacedTxHash`). Shared store: the row is
   * replaced only if it is still stored (another replica may have replaced it first).
   */
  private async replace(old: OutboxEntry): Promise<void> {
    this.log.warn({ txId: old.txId, hash: old.hash, nonce: old.nonce }, "another transaction took a ledger record's nonce; recording it again under a new nonce")
    const key = nonceKey(BigInt(old.nonce))
    const prev = this.transactions.liveRecord(old.txId) ?? (await this.transactions.get(old.txId))
    const ops = (hash: Hex): BatchOp[] => {
      const del: BatchOp = { type: 'del', coll: this.entries, key }
      const rec = this.transactions.liveRecord(old.txId) ?? prev
      if (!rec) return [del]
      return [del, ...this.transactions.ops({ ...rec, txHash: hash, ledger: { status: 'queued', replacedTxHash: old.hash } }, rec)]
    }
    const still = async (): Promise<boolean> => (await this.entries.get(key))?.hash === old.hash
    try {
      await this.enqueue({ entry: this.writer.entryOf(old.raw), txId: old.txId, ops, ...(this.shared ? { still } : {}) })
    } catch (e) {
      if ((e as { code?: string }).code !== 'superseded') throw e
    }
    // Recorded again (or by another replica): the old row is gone from the store and from here.
    this.unconfirmed.splice(this.unconfirmed.indexOf(old), 1)
    this.stored--
    this.sentAt.delete(old.hash)
    this.firstSentAt.delete(old.txId)
  }

  /** Shared store: other replicas' rows left unsent go first, then ours again (sending what the node has is harmless). */
  private async adoptForeign(shared: SharedOutbox): Promise<void> {
    const adopt = await shared.adoptable(this.unconfirmed, this.unsent, MAX_SEND)
    if (!adopt.length) return
    this.unsent = [...adopt, ...this.unconfirmed.splice(0), ...this.unsent]
    this.stored += adopt.length
  }

  /** Stop the pump; what is stored stays stored and is sent after the next start. */
  async close(): Promise<void> {
    this.closed = true
    if (this.timer) clearTimeout(this.timer)
    this.timer = null
    await this.pumping
    await this.writer.close()
  }

  /** Wait until every stored record is confirmed (tests, graceful drains), bounded by `ms`. */
  async drain(ms: number): Promise<boolean> {
    const end = Date.now() + ms
    while (Date.now() < end) {
      if (this.pending() === 0) return true
      this.schedule(0)
      await new Promise((r) => setTimeout(r, 20))
    }
    return false
  }
}
