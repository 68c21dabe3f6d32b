import { PaygateError, notFound } from '../errors/index.js'
import type { Logger } from '../log/index.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { randomBase62 } from '../util/random.js'
import type { AttemptResult } from './channels/http.js'
import { maskChannel } from './mask.js'
import type { Delivery, DeliveryStatus } from './model.js'
import { afterFailure, ok } from './schedule.js'

export type Sender = (d: Delivery) => Promise<AttemptResult>

export interface QueueOptions {
  /** Attempts in flight at once. */
  concurrency: number
  /** How often (real time) the queue looks for attempts that came due. */
  pollMs?: number
  /** Delivered and dropped deliveries are deleted this long after their last change. */
  retentionMs: number
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
 */
export class DeliveryQueue {
  readonly coll: Collection<Delivery>
  readonly dueColl: Collection<number>
  /** Deliveries waiting (pending, retrying) by id, with when they are due: the records stay on disk, read when attempted. */
  private readonly waiting = new Map<string, number>()
  private readonly inFlight = new Set<string>()
  private readonly running = new Set<Promise<void>>()
  private timer: NodeJS.Timeout | null = null
  private sweepTimer: NodeJS.Timeout | null = null
  private closed = false
  private readonly pollMs: number

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
  }

  async start(): Promise<void> {
    // The index is written with every change of a delivery, so it holds exactly the waiting ones.
    for await (const [id, nextAt] of this.dueColl.entries()) this.waiting.set(id, nextAt)
    this.sweepTimer = setInterval(() => void this.sweep().catch((e: unknown) => this.log.warn({ err: e }, 'sweeping old deliveries failed')), SWEEP_EVERY_MS)
    this.sweepTimer.unref()
    this.kick()
  }

  /** Deliveries waiting to be delivered (pending or retrying): the queue depth gauge. */
  depth(): number {
    return this.waiting.size
  }

  /** The ops that store new deliveries (the caller writes them with its own). */
  ops(ds: readonly Delivery[]): BatchOp[] {
    return ds.flatMap((d): BatchOp[] => [
      { type: 'put', coll: this.coll as Collection<unknown>, key: d.id, value: d },
      { type: 'put', coll: this.dueColl as Collection<unknown>, key: d.id, value: d.nextAt ?? 0 },
    ])
  }

  /** Take deliveries whose ops are written. */
  accept(ds: readonly Delivery[]): void {
    for (const d of ds) this.waiting.set(d.id, d.nextAt ?? 0)
    this.kick()
  }

  /** Look for due attempts now (after an enqueue, or a test moving its clock). */
  kick(): void {
    if (this.closed) return
    if (this.timer) clearTimeout(this.timer)
    this.timer = null
    this.pump()
  }

  /** Start what is due, up to the concurrency; look again after `pollMs`. */
  private pump(): void {
    if (this.closed) return
    const now = this.clock.now()
    // Full (receivers that hang): nothing to start, and no list of the waiting to build.
    const due = this.inFlight.size >= this.opts.concurrency ? [] : [...this.waiting].filter(([id, at]) => !this.inFlight.has(id) && at <= now).sort((a, b) => a[1] - b[1])
    for (const [id] of due) {
      if (this.inFlight.size >= this.opts.concurrency) break
      this.inFlight.add(id)
      const p = this.attempt(id).finally(() => {
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

  /** Tests: start what is due and wait until every attempt in flight has finished and nothing is due. */
  async settle(): Promise<void> {
    this.kick()
    while (this.running.size) {
      await Promise.all([...this.running])
      this.kick()
    }
  }

  private async attempt(id: string): Promise<void> {
    const d = await this.coll.get(id).catch(() => undefined)
    if (!d || (d.status !== 'pending' && d.status !== 'retrying')) {
      if (!this.closed) this.waiting.delete(id)
      return
    }
    let r: AttemptResult
    try {
      r = await this.send(d)
    } catch (e) {
      r = { status: null, error: (e as Error).message ?? String(e) }
    }
    if (this.closed) return // written at the next start: the attempt is repeated, same id
    const now = this.clock.now()
    const attempts = [...d.attempts, { at: now, status: r.status, error: r.error }]
    const failures = attempts.filter((a) => !ok(a.status)).length
    const next: Delivery = ok(r.status)
      ? { ...d, attempts, status: 'delivered', nextAt: null, updatedAt: now }
      : { ...d, attempts, ...afterFailure(failuresSinceRetry(d, failures), now), updatedAt: now }
    try {
      await this.store.batch(this.write(next))
    } catch (e) {
      this.log.warn({ err: e, deliveryId: d.id }, 'writing a delivery attempt failed; it is attempted again')
      return
    }
    if (next.status === 'delivered' || next.status === 'dropped') this.waiting.delete(d.id)
    else this.waiting.set(d.id, next.nextAt ?? 0)
    if (next.status === 'dropped') {
      this.log.warn({ deliveryId: d.id, event: d.event, agentId: d.agentId, channel: maskChannel(d.channel), attempts: attempts.length, error: r.error }, 'notification dropped after its last retry')
    }
  }

  private write(d: Delivery): BatchOp[] {
    const final = d.status === 'delivered' || d.status === 'dropped'
    return [
      { type: 'put', coll: this.coll as Collection<unknown>, key: d.id, value: d },
      final ? { type: 'del', coll: this.dueColl as Collection<unknown>, key: d.id } : { type: 'put', coll: this.dueColl as Collection<unknown>, key: d.id, value: d.nextAt ?? 0 },
    ]
  }

  async get(id: string): Promise<Delivery> {
    const d = await this.coll.get(id)
    if (!d) throw notFound(`delivery ${id}`)
    return d
  }

  /** Send a dropped delivery again: a fresh schedule, the same id and body. Others: 409. */
  async retry(id: string): Promise<Delivery> {
    const d = await this.get(id)
    if (d.status !== 'dropped') throw new PaygateError('conflict', `delivery ${id} is ${d.status}; only a dropped delivery can be retried`, { extra: { status: d.status } })
    const now = this.clock.now()
    const next: Delivery = { ...d, status: 'pending', nextAt: now, retriedAt: [...(d.retriedAt ?? []), now], updatedAt: now }
    await this.store.batch(this.write(next))
    this.accept([next])
    return next
  }

  /** Newest first, filtered; `cursor`: the last id of the previous page. */
  async list(f: { agentId?: string; alertId?: string; status?: DeliveryStatus; limit: number; cursor?: string }): Promise<{ deliveries: Delivery[]; nextCursor: string | null }> {
    const out: Delivery[] = []
    let scanned = 0
    for await (const [, d] of this.coll.entries({ reverse: true, ...(f.cursor ? { lt: f.cursor } : {}) })) {
      scanned++
      if ((f.agentId && d.agentId !== f.agentId) || (f.alertId && d.alertId !== f.alertId) || (f.status && d.status !== f.status)) continue
      out.push(d)
      if (out.length > f.limit || scanned > 100_000) break
    }
    const more = out.length > f.limit
    if (more) out.pop()
    return { deliveries: out, nextCursor: more ? out[out.length - 1]!.id : null }
  }

  /** Delete delivered and dropped deliveries older than the retention. */
  async sweep(): Promise<number> {
    const cutoff = this.clock.now() - this.opts.retentionMs
    const ops: BatchOp[] = []
    for await (const [id, d] of this.coll.entries()) {
      if (d.createdAt >= cutoff) break
      if ((d.status === 'delivered' || d.status === 'dropped') && d.updatedAt < cutoff) ops.push({ type: 'del', coll: this.coll as Collection<unknown>, key: id })
      if (ops.length >= 1000) break
    }
    await this.store.batch(ops)
    return ops.length
  }

  /** Stop attempting; what is waiting stays stored and resumes at the next start. */
  close(): void {
    this.closed = true
    if (this.timer) clearTimeout(this.timer)
    if (this.sweepTimer) clearInterval(this.sweepTimer)
  }
}

/** Failures counted for the schedule: those since the last manual retry (a retried delivery gets the whole schedule again). */
function failuresSinceRetry(d: Delivery, failures: number): number {
  const since = d.retriedAt?.at(-1)
  return since === undefined ? failures : d.attempts.filter((a) => a.at >= since && !ok(a.status)).length + 1
}
