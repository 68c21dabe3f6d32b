import { PaygateError, notFound } from '../errors/index.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { lockOf } from './adoption.js'
import type { Delivery, DropReason } from './model.js'

/**
 * Every change of a stored delivery: its record and its entry in the waiting index
 * (`notifyDue`) written together, and with replicas (`me`, this replica's id) read and written
 * under the delivery's database lock, stamped with its owner. The queue keeps the schedule in
 * memory (what waits, what is in flight); what a delivery becomes in the store is decided here.
 */
export class DeliveryWrites {
  constructor(
    private readonly store: Store,
    private readonly coll: Collection<Delivery>,
    private readonly dueColl: Collection<number>,
    private readonly clock: Clock,
    /** This replica's id when replicas share the store; null on LevelDB. */
    private readonly me: string | null,
  ) {}

  /** The ops that store new deliveries (the caller writes them with its own). */
  ops(ds: readonly Delivery[]): BatchOp[] {
    return ds.flatMap((d): BatchOp[] => [
      { type: 'put', coll: this.coll as Collection<unknown>, key: d.id, value: this.owned(d) },
      { type: 'put', coll: this.dueColl as Collection<unknown>, key: d.id, value: d.nextAt ?? 0 },
    ])
  }

  /** `d` stamped with this replica as its owner (unchanged on LevelDB). */
  private owned(d: Delivery): Delivery {
    return this.me ? { ...d, owner: this.me } : d
  }

  /**
   * Write an attempt's result; with replicas only while this one still owns it. A delivery
   * cancelled during the attempt (`cancel`) stays dropped, with the attempt added, unless the
   * attempt delivered it. What was written, or null when not (no longer ours).
   */
  async attempted(next: Delivery): Promise<Delivery | null> {
    const merged = (cur: Delivery | undefined): Delivery =>
      cur?.status === 'dropped' && cur.dropReason && cur.dropReason !== 'retries_exhausted' && next.status !== 'delivered'
        ? { ...next, status: 'dropped', nextAt: null, dropReason: cur.dropReason }
        : next
    if (!this.me) {
      const out = merged(await this.coll.get(next.id))
      await this.store.batch(this.write(out))
      return out
    }
    const { result, written } = await this.store.transact(lockOf(next.id), async () => {
      const cur = await this.coll.get(next.id)
      if (cur?.owner !== this.me) return { ops: [], result: null }
      const out = merged(cur)
      return { ops: this.write(out), result: out }
    })
    const w = await written
    if (!w.ok) throw w.error
    return result
  }

  /** Drop one waiting delivery for `why` (under its lock with replicas, whoever owns it); whether it was waiting. */
  drop(id: string, why: DropReason): Promise<boolean> {
    return this.changeOne(id, async () => {
      const d = await this.coll.get(id)
      if (!d || (d.status !== 'pending' && d.status !== 'retrying')) return { ops: [], result: false }
      // Its owner stays: a replica that holds it in memory finds it dropped at its next look.
      return { ops: this.write({ ...d, status: 'dropped', nextAt: null, dropReason: why, updatedAt: this.clock.now() }, false), result: true }
    })
  }

  async get(id: string): Promise<Delivery> {
    const d = await this.coll.get(id)
    if (!d) throw notFound(`delivery ${id}`)
    return d
  }

  /** A dropped delivery pending again: a fresh schedule, the same id and body. Others: 409. */
  retry(id: string): Promise<Delivery> {
    // Under the delivery's lock: two replicas retrying it at once, one wins and owns it; the other gets the 409.
    return this.changeOne(id, async () => {
      const d = await this.get(id)
      if (d.status !== 'dropped') throw new PaygateError('conflict', `delivery ${id} is ${d.status}; only a dropped delivery can be retried`, { extra: { status: d.status } })
      if (d.dropReason === 'alert_deleted' || d.dropReason === 'webhook_deleted') {
        const what = d.dropReason === 'alert_deleted' ? `its alert ${d.alertId}` : `its webhook endpoint ${d.webhookId}`
        throw new PaygateError('conflict', `delivery ${id} was dropped because ${what} was deleted; it is not sent again`, { extra: { status: d.status } })
      }
      const now = this.clock.now()
      const { dropReason: _, ...rest } = d
      const next: Delivery = this.owned({ ...rest, status: 'pending', nextAt: now, retriedAt: [...(d.retriedAt ?? []), now], updatedAt: now })
      return { ops: this.write(next), result: next }
    })
  }

  /** A read-modify-write of one delivery: under its lock when replicas share the store, else as is; its result once written. */
  private async changeOne<T>(id: string, change: () => Promise<{ ops: BatchOp[]; result: T }>): Promise<T> {
    if (!this.me) {
      const r = await change()
      await this.store.batch(r.ops)
      return r.result
    }
    const r = await this.store.transact(lockOf(id), change)
    const w = await r.written
    if (!w.ok) throw w.error
    return r.result
  }

  /** A delivery's ops; `own`: stamped as this replica's (not when dropping another's). */
  private write(d: Delivery, own = true): BatchOp[] {
    const final = d.status === 'delivered' || d.status === 'dropped'
    return [
      { type: 'put', coll: this.coll as Collection<unknown>, key: d.id, value: own ? this.owned(d) : d },
      final ? { type: 'del', coll: this.dueColl as Collection<unknown>, key: d.id } : { type: 'put', coll: this.dueColl as Collection<unknown>, key: d.id, value: d.nextAt ?? 0 },
    ]
  }
}
