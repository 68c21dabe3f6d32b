import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Delivery, DeliveryStatus } from './model.js'

/** The delivery log's reads and its retention, over the queue's collection of deliveries (ids sort by creation). */

export interface DeliveryFilter {
  agentId?: string
  alertId?: string
  status?: DeliveryStatus
  limit: number
  /** The last id of the previous page. */
  cursor?: string
}

/** Newest first, filtered (at most 100,000 entries scanned a page). */
export async function listDeliveries(coll: Collection<Delivery>, f: DeliveryFilter): Promise<{ deliveries: Delivery[]; nextCursor: string | null }> {
  const out: Delivery[] = []
  let scanned = 0
  for await (const [, d] of coll.entries({ reverse: true, ...(f.cursor ? { lt: f.cursor } : {}) })) {
    scanned++
    if ((f.agentId && d.agentId !== f.agentId) || (f.alertId && d.alertId !== f.alertId) || (f.status && d.status !== f.status)) continue
    out.push(d)
    if (out.length > f.limit || scanned > 100_000) break
  }
  const more = out.length > f.limit
  if (more) out.pop()
  return { deliveries: out, nextCursor: more ? out[out.length - 1]!.id : null }
}

/** Delete delivered and dropped deliveries created and last changed before `cutoff` (1,000 a call); how many. */
export async function sweepDeliveries(store: Store, coll: Collection<Delivery>, cutoff: number): Promise<number> {
  const ops: BatchOp[] = []
  for await (const [id, d] of coll.entries()) {
    if (d.createdAt >= cutoff) break
    if ((d.status === 'delivered' || d.status === 'dropped') && d.updatedAt < cutoff) ops.push({ type: 'del', coll: coll as Collection<unknown>, key: id })
    if (ops.length >= 1000) break
  }
  await store.batch(ops)
  return ops.length
}
