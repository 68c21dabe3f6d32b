import type { RecordChange } from '../ledger/record-hooks.js'
import type { Logger } from '../log/index.js'
import type { RateWindow } from '../policy/model.js'
import type { PolicyStore } from '../policy/store.js'
import { usedToday } from '../policy/usage.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { randomBase62 } from '../util/random.js'
import type { AlertBook } from './alerts.js'
import { slackMessage } from './channels/slack.js'
import { builtInKey, capKey, fire, inert, testPayload, windowsOf, type Fired, type Message } from './fire.js'
import type { Alert, Delivery, EventEntry, SpecEvent } from './model.js'
import { type DeliveryQueue, newDeliveryId } from './queue.js'
import type { UrlSeal } from './sealed-urls.js'
import type { MinuteAsOf, MinuteSpend, SpendWindow } from './spend.js'

/** An event entry not found this long after its record hook ran belongs to a write that failed: forgotten. */
const UNWRITTEN_AFTER_MS = 30_000
/** Replicas: an entry still stored this long after it was made was left by a replica that stopped (see `orphans`). */
const ORPHANED_AFTER_MS = 30_000
/** How often (real time) skipped counts of minutes that are over are logged. */
const CAP_LOG_EVERY_MS = 10_000
/** Replicas: the database lock every expansion holds (the fired state and endpoint caps are read-modify-written across agents). */
const EXPAND_LOCK = 'notify\u0000expand'

const asOfEntry = (a: MinuteAsOf): { writer: string; units: string } => ({ writer: a.writer, units: a.units.toString() })

export interface NotifierOptions {
  /** Deliveries per account webhook endpoint per minute (a storm of refusals must not become a storm of webhooks). */
  endpointPerMinute: number
  /** Deliveries store their URL encrypted (sealed-urls.ts). */
  seal: UrlSeal
}

/**
 * The notifier: its record-hook contributor writes an event entry (`notifyEvents`) in the
 * same atomic write as each rejected or paid record that could fire something (fire.ts
 * `inert`), so no event is lost in a crash and
 * none exists for a record that was not written. It then expands each entry, in order,
 * into deliveries and the alerts' fired state in one batch of its own that also deletes
 * the entry, and hands the deliveries to the queue. Payments never wait for any of it.
 *
 * Replicas on one database: entry ids carry a random part per process (two replicas' ids never
 * collide), each expansion runs under one database lock and re-reads its entry there (so a
 * threshold fires once across replicas, an endpoint's per-minute cap counts every replica's
 * deliveries, and an entry is expanded once even when two replicas both hold it), and entries
 * a stopped replica left unexpanded are picked up by the others (`orphans`).
 */
export class Notifier {
  readonly events: Collection<EventEntry>
  /** `stored`: read from the store (start, orphans), so one not found was expanded already (by another replica). */
  private pending: { id: string; since: number; stored?: boolean }[] = []
  private orphanTimer: NodeJS.Timeout | null = null
  private seq = 0
  private running: Promise<void> | null = null
  private again = false
  private closed = false
  private retryTimer: NodeJS.Timeout | null = null
  /** Deliveries an endpoint's per-minute cap skipped, by endpoint, in the minute (of the events) they fell in: logged once that minute is over. */
  private readonly skipped = new Map<string, { minute: number; events: Map<SpecEvent, number> }>()
  private capTimer: NodeJS.Timeout | null = null
  /** Replicas share the store (PostgreSQL). */
  private readonly shared: boolean
  /** Replicas: in every event id, so two processes numbering events in one millisecond never make the same id. */
  private readonly idPart: string

  constructor(
    private readonly store: Store,
    private readonly book: AlertBook,
    private readonly policies: PolicyStore,
    private readonly spend: MinuteSpend,
    private readonly window: SpendWindow,
    private readonly queue: DeliveryQueue,
    private readonly clock: Clock,
    private readonly log: Logger,
    private readonly opts: NotifierOptions,
  ) {
    this.events = store.collection('notifyEvents')
    this.shared = store.backend === 'postgres'
    this.idPart = this.shared ? randomBase62(6) : ''
  }

  /** Entries left by the last run (written, not yet expanded) are expanded first. */
  async start(): Promise<void> {
    const now = this.clock.now()
    if (!this.shared) for await (const id of this.events.keys()) this.pending.push({ id, since: now, stored: true })
    else {
      // Replicas: only those of stopped replicas (live ones expand their own; one taken here would look unwritten to its maker), now and every 5 s.
      await this.orphans()
      this.orphanTimer = setInterval(() => void this.orphans().catch((e: unknown) => this.log.warn({ err: e }, 'looking for event entries of stopped replicas failed')), 5_000)
      this.orphanTimer.unref()
    }
    this.kick()
  }

  private newId(at: number): string {
    return `ev_${at.toString(36).padStart(9, '0')}${(this.seq++ % 36 ** 6).toString(36).padStart(6, '0')}${this.idPart}`
  }

  /**
   * Replicas: queue the stored entries made more than `ORPHANED_AFTER_MS` ago that this process
   * does not hold: a replica that wrote them stopped before expanding them (its own are
   * expanded within moments). Expanding one twice is harmless (see `expand`). Called on the
   * delivery queue's adoption look; the number queued.
   */
  async orphans(): Promise<number> {
    if (!this.shared || this.closed) return 0
    const held = new Set(this.pending.map((p) => p.id))
    const before = (this.clock.now() - ORPHANED_AFTER_MS).toString(36).padStart(9, '0')
    let n = 0
    for await (const id of this.events.keys({ lt: `ev_${before}` })) {
      if (held.has(id)) continue
      this.pending.push({ id, since: this.clock.now(), stored: true })
      n++
    }
    if (n) this.kick()
    return n
  }

  /** The record-hook contributor: synchronous, never throws. */
  readonly contributor = (change: RecordChange): BatchOp[] => {
    // A call served under an MPP session has no record and fires no alert.
    if (change.kind === 'session') return []
    try {
      const r = change.record
      let entry: EventEntry
      const ops: BatchOp[] = []
      if (change.kind === 'rejected') {
        if (inert({ kind: 'violation' }, this.book.ofAgent(r.agentId), this.book.listEndpoints())) return []
        entry = {
          id: this.newId(this.clock.now()),
          kind: 'violation',
          agentId: r.agentId,
          at: r.updatedAt,
          txId: r.id,
          reason: r.reason ?? 'policy_violation',
          detail: r.detail ?? '',
          endpoint: r.endpoint,
        }
      } else if (change.kind === 'paid') {
        const at = r.updatedAt
        const usage = change.usage
        const policy = this.policies.cachedPolicy(r.agentId)
        // Not cached (replicas cache no policy): the daily budget the payment was decided under, as the change carries it (null: none).
        const budget = policy ? policy.dailyBudget : change.dailyBudget
        const known = policy ? (budget ?? null) : change.dailyBudget
        ops.push(...this.spend.add(r.agentId, at, BigInt(r.amount)))
        // Most payments can fire nothing (no alerts, under the budget's warning): no entry to write and expand.
        const used = usage ? usedToday(usage, at) : null
        const alerts = this.book.ofAgent(r.agentId)
        if (known !== undefined && inert({ kind: 'paid', usedToday: used, dailyBudget: known === null ? null : BigInt(known) }, alerts, [])) return ops
        entry = {
          ...{ id: this.newId(this.clock.now()), kind: 'paid' as const, agentId: r.agentId, at, txId: r.id, amount: r.amount },
          ...{ usedToday: used !== null ? used.toString() : r.amount, periodStart: usage?.periodStart ?? null },
          ...(budget !== undefined ? { dailyBudget: budget } : {}),
          ...(alerts.some((a) => a.type === 'spend_rate') ? { minuteAsOf: asOfEntry(this.spend.asOf(r.agentId, at)) } : {}),
        }
      } else return []
      ops.push({ type: 'put', coll: this.events as Collection<unknown>, key: entry.id, value: entry })
      this.pending.push({ id: entry.id, since: this.clock.now() })
      setImmediate(() => this.kick())
      return ops
    } catch (e) {
      this.log.error({ err: e }, 'the notifications record hook failed; this record sends no notification')
      return []
    }
  }

  /** Expand what is pending (one pass at a time; a call meanwhile runs another after it). */
  kick(): void {
    if (this.closed) return
    if (this.running) {
      this.again = true
      return
    }
    this.running = this.drain()
      .catch((e: unknown) => {
        if (this.closed) return
        this.log.error({ err: e }, 'expanding notification events failed; retrying')
        this.later(1000)
      })
      .finally(() => {
        this.running = null
        if (this.again) {
          this.again = false
          this.kick()
        }
      })
  }

  /** Event entries not yet expanded. */
  backlog(): number {
    return this.pending.length
  }

  /** Tests and the bench: expand what is pending now and wait until nothing is being expanded. */
  async idle(): Promise<void> {
    this.kick()
    while (this.running) await this.running
  }

  private async drain(): Promise<void> {
    while (this.pending.length && !this.closed) {
      const p = this.pending[0]!
      const entry = await this.events.get(p.id)
      if (!entry) {
        // Its batch is not logged yet (look again soon, keeping the order), or it failed (forgotten).
        if (!p.stored && this.clock.now() - p.since < UNWRITTEN_AFTER_MS) return this.later()
        this.pending.shift()
        continue
      }
      await this.expand(entry)
      this.pending.shift()
    }
  }

  private later(ms = 20): void {
    if (this.retryTimer || this.closed) return
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null
      this.kick()
    }, ms)
    this.retryTimer.unref()
  }

  /** One event: its deliveries, the changed fired state and the entry's delete, in one batch. */
  private async expand(ev: EventEntry): Promise<void> {
    if (!this.shared) {
      const out = await this.decide(ev)
      await this.store.batch(out.ops)
      return this.handOver(ev, out)
    }
    // Replicas: under the one lock, reading the entry again (another replica may have expanded it meanwhile) and the fired state after the last holder's write.
    const { result, written } = await this.store.transact(EXPAND_LOCK, async () => {
      const cur = await this.events.get(ev.id)
      if (!cur) return { ops: [], result: null }
      const out = await this.decide(cur)
      return { ops: out.ops, result: out }
    })
    const w = await written
    if (!w.ok) throw w.error
    if (result) this.handOver(ev, result)
  }

  /** What an event sends and changes: the batch that writes it, its deliveries, the endpoints' skipped counts. */
  private async decide(ev: EventEntry): Promise<{ ops: BatchOp[]; deliveries: Delivery[]; capped: Map<string, Map<SpecEvent, number>> }> {
    const alerts = this.book.ofAgent(ev.agentId)
    const endpoints = this.book.listEndpoints()
    const keys = [...alerts.map((a) => a.alertId), builtInKey(ev.agentId), ...endpoints.map((w) => capKey(w.webhookId))]
    const states = await this.book.firedColl.getMany(keys)
    const fired = new Map<string, Fired>()
    for (const [i, s] of states.entries()) if (s) fired.set(keys[i]!, s)
    let dailyBudget: bigint | null = null
    const windowSpend = new Map<RateWindow, bigint>()
    if (ev.kind === 'paid') {
      const b = ev.dailyBudget !== undefined ? ev.dailyBudget : (await this.policies.policyOf(ev.agentId)).dailyBudget
      dailyBudget = b === undefined || b === null ? null : BigInt(b)
      // As of the payment: its minute's bucket, read now, may hold later payments of that minute.
      const asOf = ev.minuteAsOf ? { writer: ev.minuteAsOf.writer, minute: ev.at - (ev.at % 60_000), units: BigInt(ev.minuteAsOf.units) } : undefined
      for (const [w, ms] of windowsOf(alerts)) windowSpend.set(w, await this.window.spent(ev.agentId, ev.at - ms, ev.at, asOf))
    }
    const out = fire({ event: ev, alerts, endpoints, fired, dailyBudget, windowSpend, endpointPerMinute: this.opts.endpointPerMinute })
    const now = this.clock.now()
    const deliveries = out.messages.map((m) => this.delivery(m, now))
    const ops: BatchOp[] = [...this.queue.ops(deliveries), { type: 'del', coll: this.events as Collection<unknown>, key: ev.id }]
    for (const [k, s] of out.fired) ops.push({ type: 'put', coll: this.book.firedColl as Collection<unknown>, key: k, value: s })
    return { ops, deliveries, capped: out.capped }
  }

  /** Once written: the deliveries to the queue, and what an endpoint's cap skipped to its minute's count. */
  private handOver(ev: EventEntry, out: { deliveries: Delivery[]; capped: Map<string, Map<SpecEvent, number>> }): void {
    this.queue.accept(out.deliveries)
    const minute = ev.at - (ev.at % 60_000)
    for (const [webhookId, events] of out.capped) {
      let s = this.skipped.get(webhookId)
      if (s && s.minute !== minute) this.logSkipped(webhookId)
      if (!s || s.minute !== minute) this.skipped.set(webhookId, (s = { minute, events: new Map() }))
      for (const [event, n] of events) s.events.set(event, (s.events.get(event) ?? 0) + n)
    }
    this.logCaps(false)
    if (this.skipped.size && !this.capTimer) {
      this.capTimer = setInterval(() => this.logCaps(false), CAP_LOG_EVERY_MS)
      this.capTimer.unref()
    }
  }

  /**
   * One warning per endpoint and minute with the count skipped (a storm of refusals must not
   * become a storm of log lines either), once the minute is over; `all`: those of the current
   * minute too (at close).
   */
  private logCaps(all: boolean): void {
    const now = this.clock.now()
    for (const [webhookId, s] of this.skipped) if (all || s.minute + 60_000 <= now) this.logSkipped(webhookId)
    if (!this.skipped.size && this.capTimer) {
      clearInterval(this.capTimer)
      this.capTimer = null
    }
  }

  private logSkipped(webhookId: string): void {
    const s = this.skipped.get(webhookId)
    if (!s) return
    this.skipped.delete(webhookId)
    const skipped = [...s.events.values()].reduce((a, b) => a + b, 0)
    this.log.warn(
      { webhookId, minute: new Date(s.minute).toISOString(), skipped, events: Object.fromEntries(s.events), endpointPerMinute: this.opts.endpointPerMinute },
      'webhook endpoint over its per-minute cap: deliveries skipped in that minute',
    )
  }

  /** A delivery of one message: its body bytes fixed now, sent the same on every attempt. */
  private delivery(m: Message, now: number): Delivery {
    const id = newDeliveryId(now)
    const body = m.channel.type === 'slack' ? JSON.stringify(slackMessage(m.payload, id)) : JSON.stringify(m.payload)
    return {
      id,
      event: m.event,
      agentId: String(m.payload.agentId),
      alertId: m.alertId,
      webhookId: m.webhookId,
      channel: this.opts.seal.seal(m.channel),
      body,
      status: 'pending',
      attempts: [],
      nextAt: now,
      createdAt: now,
      updatedAt: now,
    }
  }

  /** `POST /v1/alerts/<id>/test`: an `alert.test` through the alert's channel. */
  async test(alert: Alert): Promise<Delivery> {
    const now = this.clock.now()
    const d = this.delivery({ event: 'alert.test', payload: testPayload(alert, now), channel: alert.notify, alertId: alert.alertId, webhookId: null }, now)
    await this.store.batch(this.queue.ops([d]))
    this.queue.accept([d])
    return d
  }

  /** Stop expanding (what is left stays stored for the next start) and wait for the pass under way. */
  async close(): Promise<void> {
    this.closed = true
    if (this.retryTimer) clearTimeout(this.retryTimer)
    if (this.orphanTimer) clearInterval(this.orphanTimer)
    await this.running
    this.logCaps(true)
  }
}
