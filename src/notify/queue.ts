import type { Logger } from '../log/index.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { randomBase62 } from '../util/random.js'
import type { AttemptResult } from './channels/http.js'
import { maskChannel } from './mask.js'
import { type DeliveryFilter, listDeliveries, sweepDeliveries } from './delivery-log.js'
import { DestinationSlots, destinationOf, PER_DESTINATION } from './destinations.js'
import type { Delivery, DropReason } from './model.js'
import { Adopter } from './adoption.js'
import { DeliveryWrites } from './delivery-writes.js'
import { afterFailure, ok } from './schedule.js'

export type Sender = (d: Delivery) => Promise<AttemptResult>

/** The replica leases (store/leases.ts `CrossLocks`) on a store shared by replicas. */
export interface ReplicaLeases {
  /** This replica's id, stamped as the owner of the deliveries it creates or adopts. */
  readonly replicaId: string
  /** When a replica's lease ends or ended; null when it was released (a graceful stop) or never held. */
  leaseEnd(replicaId: string): Promise<number | null>
}

export interface QueueOptions {
  /** Attempts in flight at once. */
  concurrency: number
  /** Attempts in flight at once to one destination (`destinationOf`). Default `PER_DESTINATION`. */
  perDestination?: number
  /** How often (real time) the queue looks for attempts that came due. */
  pollMs?: number
  /** Delivered and dropped deliveries are deleted this long after their last change. */
  retentionMs: number
  /** Replicas share the store: deliveries are owned (see `DeliveryQueue`). */
  owners?: ReplicaLeases
  /** The longest one attempt can take (notify.timeoutMs): how long an adopter waits for a live-looking owner's attempt to end. */
  attemptMs?: number
  /** How often (real time) a replica looks for deliveries of stopped replicas. Default 5 s. */
  adoptMs?: number
  /**
   * Read before each attempt: why the delivery must not be sent any more (its alert or
   * account endpoint was deleted), or null. Catches what `cancel` could not (a delivery
   * written while its alert was being deleted, one another replica holds in memory).
   */
  cancelled?: (d: Delivery) => Promise<DropReason | null>
}

/** Sortable by creation: a reverse walk lists newest first, a forward one finds what retention removes. */
export const newDeliveryId = (now: number): string => `dl_${now.toString(36).padStart(9, '0')}${randomBase62(10)}`

const SWEEP_EVERY_MS = 3_600_000

/**
 * The durable delivery queue. Every delivery is a record in the store (`notifyDeliveries`,
 * with its body bytes, attempts and next due time); those not yet delivered or dropped are
 * also indexed (`notifyDue`, id to due time, that index alone held in memory), so a restart picks the schedule up where it
 * was. Attempts run at most `concurrency` at once, off the payment path; each result is
 * written after the attempt, so a crash mid-attempt repeats it (at least once, same id).
 *
 * Replicas on one database (`owners`): each delivery names its `owner`, the replica that
 * created it, and only the owner attempts it; the others leave it alone while the owner's
 * replica lease lives. Every `adoptMs` each replica looks through the waiting index for
 * deliveries of replicas whose lease expired (killed) or was released (stopped) and adopts
 * them, each under the delivery's database lock, so exactly one replica takes each. Every
 * attempt reads its delivery first and writes its result under that lock only while it is
 * still the owner, and an adopter whose predecessor's lease merely expired waits
 * `attemptMs` before its first attempt: an attempt a stalled owner began before the adoption
 * has ended by then. So two replicas never attempt one delivery at once. On LevelDB (one
 * process) none of this runs: the index is loaded at start, as before.
 */
export class DeliveryQueue {
  readonly coll: Collection<Delivery>
  readonly dueColl: Collection<number>
  /** Deliveries waiting (pending, retrying) by id, with when they are due: the records stay on disk, read when attempted. */
  private readonly waiting = new Map<string, number>()
  private readonly inFlight = new Set<string>()
  /** Attempts in flight by destination (`destinationOf`). */
  private readonly slots: DestinationSlots
  /** The destination of waiting deliveries, once known (accepted here, or read by an attempt): the pump skips those whose destination is full. */
  private readonly dests = new Map<string, string>()
  private readonly running = new Set<Promise<void>>()
  private timer: NodeJS.Timeout | null = null
  private sweepTimer: NodeJS.Timeout | null = null
  private adoptTimer: NodeJS.Timeout | null = null
  private adopting: Promise<number> | null = null
  private closed = false
  private readonly pollMs: number
  /** This replica's id when replicas share the store; null on LevelDB. */
  private readonly me: string | null
  /** Replicas: finds and takes the deliveries of stopped replicas (adoption.ts). */
  private readonly adopter: Adopter | null
  /** Every change of a stored delivery, under its lock with replicas (delivery-writes.ts). */
  private readonly writes: DeliveryWrites

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    private readonly log: Logger,
    private readonly send: Sender,
    private readonly opts: QueueOptions,
  ) {
    this.coll = store.collection('notifyDeliveries')
    this.dueColl = store.collection('notifyDue')
    this.pollMs = opts.pollMs ?? 1000
    this.slots = new DestinationSlots(opts.perDestination ?? PER_DESTINATION)
    this.me = opts.owners?.replicaId ?? null
    this.writes = new DeliveryWrites(store, this.coll, this.dueColl, clock, this.me)
    this.adopter = opts.owners
      ? new Adopter({
          ...{ store, coll: this.coll, dueColl: this.dueColl, clock, log, owners: opts.owners, attemptMs: opts.attemptMs ?? 0 },
          isWaiting: (id) => this.waiting.has(id),
          wait: (id, at, dest) => {
            this.waiting.set(id, at)
            this.dests.set(id, dest)
          },
          closed: () => this.closed,
        })
      : null
  }

  async start(): Promise<void> {
    if (this.me) {
      // Others take a delivery whose owner has no lease row as released: own none before the row is written.
      await this.leaseWritten()
      // Nothing is ours yet (a new id each start): what the last run left is adopted like any stopped replica's.
      await this.adopt()
      this.adoptTimer = setInterval(() => void this.adopt().catch((e: unknown) => this.log.warn({ err: e }, 'looking for deliveries of stopped replicas failed')), this.opts.adoptMs ?? 5_000)
      this.adoptTimer.unref()
    } else {
      // The index is written with every change of a delivery, so it holds exactly the waiting ones.
      for await (const [id, nextAt] of this.dueColl.entries()) this.waiting.set(id, nextAt)
    }
    this.sweepTimer = setInterval(() => void this.sweep().catch((e: unknown) => this.log.warn({ err: e }, 'sweeping old deliveries failed')), SWEEP_EVERY_MS)
    this.sweepTimer.unref()
    this.kick()
  }

  /** Replicas: wait (about 30 s at most) until this replica's lease row exists (its claim runs alongside the start). */
  private async leaseWritten(): Promise<void> {
    for (let i = 0, wait = 5; (await this.opts.owners!.leaseEnd(this.me!)) === null; i++, wait = Math.min(wait * 2, 500)) {
      if (this.closed) return
      if (i === 70) return this.log.warn('this replica holds no lease yet; its deliveries may be adopted by others before it does')
      await new Promise((r) => setTimeout(r, wait))
    }
  }

  /** Deliveries waiting to be delivered (pending or retrying): the queue depth gauge (with replicas: those this replica owns). */
  depth(): number {
    return this.waiting.size
  }

  /** The ops that store new deliveries (the caller writes them with its own). */
  ops(ds: readonly Delivery[]): BatchOp[] {
    return this.writes.ops(ds)
  }

  /** Take deliveries whose ops are written. */
  accept(ds: readonly Delivery[]): void {
    for (const d of ds) {
      this.waiting.set(d.id, d.nextAt ?? 0)
      this.dests.set(d.id, destinationOf(d.channel))
    }
    this.kick()
  }

  /** Look for due attempts now (after an enqueue, or a test moving its clock). */
  kick(): void {
    if (this.closed) return
    if (this.timer) clearTimeout(this.timer)
    this.timer = null
    this.pump()
  }

  /**
   * Start what is due, oldest first, up to the concurrency and, per destination, up to
   * `perDestination`: a due delivery whose destination is full is passed over for the next
   * one. Look again after `pollMs`.
   */
  private pump(): void {
    if (this.closed) return
    const now = this.clock.now()
    // Full (receivers that hang): nothing to start, and no list of the waiting to build.
    const due = this.inFlight.size >= this.opts.concurrency ? [] : [...this.waiting].filter(([id, at]) => !this.inFlight.has(id) && at <= now).sort((a, b) => a[1] - b[1])
    for (const [id] of due) {
      if (this.inFlight.size >= this.opts.concurrency) break
      const dest = this.dests.get(id)
      if (dest !== undefined && !this.slots.claim(dest)) continue
      // Not known yet (loaded at start, adopted): the attempt claims its destination once it has read the delivery.
      const slot = { dest: dest ?? null }
      this.inFlight.add(id)
      const p = this.attempt(id, slot).finally(() => {
        if (slot.dest !== null) this.slots.release(slot.dest)
        this.inFlight.delete(id)
        this.running.delete(p)
        this.kick()
      })
      this.running.add(p)
    }
    if (!this.timer && this.waiting.size) {
      this.timer = setTimeout(() => {
        this.timer = null
        this.pump()
      }, this.pollMs)
      this.timer.unref()
    }
  }

  /** A delivery no longer waiting here. */
  private forget(id: string): void {
    this.waiting.delete(id)
    this.dests.delete(id)
  }

  /** Tests: start what is due and wait until every attempt in flight has finished and nothing is due. */
  async settle(): Promise<void> {
    this.kick()
    while (this.running.size) {
      await Promise.all([...this.running])
      this.kick()
    }
  }

  /**
   * Replicas: adopt the waiting deliveries of replicas whose lease ended (see the class). Runs
   * every `adoptMs`, one look at a time; the number adopted. Each candidate is read once and
   * then skipped while its owner's lease lives.
   */
  adopt(): Promise<number> {
    if (!this.me || this.closed) return Promise.resolve(0)
    this.adopting ??= this.adopter!.look()
      .then((n) => {
        if (n) this.kick()
        return n
      })
      .finally(() => {
        this.adopting = null
      })
    return this.adopting
  }

  /** One attempt; `slot.dest`: the destination slot it holds (null: none yet, claimed here once the delivery is read). */
  private async attempt(id: string, slot: { dest: string | null }): Promise<void> {
    const d = await this.coll.get(id).catch(() => undefined)
    // Gone, finished, or (replicas) adopted by another replica while this one was stalled: not ours to attempt.
    if (!d || (d.status !== 'pending' && d.status !== 'retrying') || (this.me && d.owner !== this.me)) {
      if (!this.closed) this.forget(id)
      return
    }
    const why = await this.opts.cancelled?.(d).catch(() => null)
    if (why) {
      await this.cancelOne(id, why).catch((e: unknown) => this.log.warn({ err: e, deliveryId: id }, 'dropping a delivery of a deleted alert or endpoint failed'))
      return
    }
    if (slot.dest === null) {
      const dest = destinationOf(d.channel)
      this.dests.set(id, dest)
      // Its destination is full: left waiting, and passed over by the pump now that its destination is known.
      if (!this.slots.claim(dest)) return
      slot.dest = dest
    }
    let r: AttemptResult
    try {
      r = await this.send(d)
    } catch (e) {
      r = { status: null, error: (e as Error).message ?? String(e) }
    }
    // LevelDB: written at the next start, the attempt is repeated, same id. (Replicas: close() waits for it and it is written.)
    if (this.closed && !this.me) return
    const now = this.clock.now()
    const attempts = [...d.attempts, { at: now, status: r.status, error: r.error, ...(this.me ? { by: this.me } : {}) }]
    const failures = attempts.filter((a) => !ok(a.status)).length
    const after = afterFailure(failuresSinceRetry(d, failures), now)
    const computed: Delivery = ok(r.status)
      ? { ...d, attempts, status: 'delivered', nextAt: null, updatedAt: now }
      : { ...d, attempts, ...after, ...(after.status === 'dropped' ? { dropReason: 'retries_exhausted' as const } : {}), updatedAt: now }
    let next: Delivery
    try {
      const written = await this.writes.attempted(computed)
      if (!written) {
        this.forget(d.id)
        return
      }
      next = written
    } catch (e) {
      this.log.warn({ err: e, deliveryId: d.id }, 'writing a delivery attempt failed; it is attempted again')
      return
    }
    if (next.status === 'delivered' || next.status === 'dropped') this.forget(d.id)
    else this.waiting.set(d.id, next.nextAt ?? 0)
    if (next.status === 'dropped' && next.dropReason === 'retries_exhausted') {
      this.log.warn({ deliveryId: d.id, event: d.event, agentId: d.agentId, channel: maskChannel(d.channel), attempts: attempts.length, error: r.error }, 'notification dropped after its last retry')
    }
  }

  /** Drop one waiting delivery for `why` (under its lock with replicas, whoever owns it); whether it was waiting. */
  private async cancelOne(id: string, why: DropReason): Promise<boolean> {
    const done = await this.writes.drop(id, why)
    if (!this.closed) this.forget(id)
    if (done) this.log.info({ deliveryId: id, reason: why }, 'notification dropped: what it was for was deleted')
    return done
  }

  /**
   * Drop every waiting delivery that `match`es (those of a deleted alert or account
   * endpoint): not attempted again, shown `dropped` with `why`. With replicas every
   * replica's (the waiting index holds them all). The number dropped.
   */
  async cancel(match: (d: Delivery) => boolean, why: DropReason): Promise<number> {
    const ids: string[] = []
    if (this.me) for await (const id of this.dueColl.keys()) ids.push(id)
    else ids.push(...this.waiting.keys())
    let n = 0
    for (let i = 0; i < ids.length; i += 100) {
      const chunk = ids.slice(i, i + 100)
      for (const [j, d] of (await this.coll.getMany(chunk)).entries()) {
        if (d && (d.status === 'pending' || d.status === 'retrying') && match(d) && (await this.cancelOne(chunk[j]!, why))) n++
      }
    }
    return n
  }

  get(id: string): Promise<Delivery> {
    return this.writes.get(id)
  }

  /** Send a dropped delivery again: a fresh schedule, the same id and body. Others: 409. */
  async retry(id: string): Promise<Delivery> {
    const next = await this.writes.retry(id)
    this.accept([next])
    return next
  }

  /** Newest first, filtered; `cursor`: the last id of the previous page. */
  list(f: DeliveryFilter): Promise<{ deliveries: Delivery[]; nextCursor: string | null }> {
    return listDeliveries(this.coll, f)
  }

  /** Delete delivered and dropped deliveries older than the retention. */
  sweep(): Promise<number> {
    return sweepDeliveries(this.store, this.coll, this.clock.now() - this.opts.retentionMs)
  }

  /**
   * Stop attempting; what is waiting stays stored and resumes at the next start. With replicas
   * the attempts under way are awaited (each ends within `attemptMs`) and written, before the
   * replica releases its lease and others adopt what it leaves.
   */
  async close(): Promise<void> {
    this.closed = true
    if (this.timer) clearTimeout(this.timer)
    if (this.sweepTimer) clearInterval(this.sweepTimer)
    if (this.adoptTimer) clearInterval(this.adoptTimer)
    if (this.me) await Promise.allSettled([...this.running, this.adopting])
  }
}

/** Failures counted for the schedule: those since the last manual retry (a retried delivery gets the whole schedule again). */
function failuresSinceRetry(d: Delivery, failures: number): number {
  const since = d.retriedAt?.at(-1)
  return since === undefined ? failures : d.attempts.filter((a) => a.at >= since && !ok(a.status)).length + 1
}
