import type { Logger } from '../log/index.js'
import type { Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { destinationOf } from './destinations.js'
import type { Delivery } from './model.js'
import type { ReplicaLeases } from './queue.js'

/** Added to `attemptMs` for what follows an attempt (its result's write). */
const FENCE_MARGIN_MS = 2_000

/** The database lock of one delivery (adoption, an attempt's result, a manual retry). */
export const lockOf = (id: string): string => `notifyDelivery\u0000${id}`

export interface AdopterDeps {
  store: Store
  coll: Collection<Delivery>
  dueColl: Collection<number>
  clock: Clock
  log: Logger
  owners: ReplicaLeases
  /** The longest one attempt can take: how long an adopter waits for a live-looking owner's attempt to end. */
  attemptMs: number
  /** Whether the queue already waits on this delivery (it is ours). */
  isWaiting: (id: string) => boolean
  /** Have the queue wait on a delivery now ours: due at `at`, to destination `dest`. */
  wait: (id: string, at: number, dest: string) => void
  closed: () => boolean
}

/**
 * Replicas on one database: finds the waiting deliveries of replicas whose lease ended (killed)
 * or was released (stopped), and takes each under its database lock, so exactly one replica
 * takes it (see DeliveryQueue). Each candidate is read once and then skipped while its owner's
 * lease lives.
 */
export class Adopter {
  /** Waiting deliveries of other replicas seen by the last look, with their owner: not read again while it lives. */
  private others = new Map<string, string>()
  private readonly me: string

  constructor(private readonly d: AdopterDeps) {
    this.me = d.owners.replicaId
  }

  /** One look through the waiting index; the number adopted. */
  async look(): Promise<number> {
    const { d } = this
    const ends = new Map<string, number | null>()
    const endOf = async (owner: string): Promise<number | null> => {
      if (!ends.has(owner)) ends.set(owner, await d.owners.leaseEnd(owner))
      return ends.get(owner)!
    }
    const live = async (owner: string | undefined): Promise<boolean> => !!owner && ((await endOf(owner)) ?? 0) > d.clock.now()
    const seen = new Map<string, string>()
    const unknown: string[] = []
    for await (const id of d.dueColl.keys()) {
      if (d.isWaiting(id)) continue
      const owner = this.others.get(id)
      if (owner && (await live(owner))) seen.set(id, owner)
      else unknown.push(id)
    }
    let adopted = 0
    for (let i = 0; i < unknown.length && !d.closed(); i += 100) {
      const ids = unknown.slice(i, i + 100)
      for (const [j, x] of (await d.coll.getMany(ids)).entries()) {
        if (!x || d.closed()) continue
        if (x.owner === this.me)
          d.wait(ids[j]!, x.nextAt ?? 0, destinationOf(x.channel)) // written just now, its accept() to follow
        else if (x.owner && (await live(x.owner))) seen.set(ids[j]!, x.owner)
        else if (await this.adoptOne(ids[j]!)) adopted++
      }
    }
    this.others = seen
    return adopted
  }

  /** Take one delivery under its lock if its owner is still gone; whether this replica took it. */
  private async adoptOne(id: string): Promise<boolean> {
    const { d } = this
    const { result, written } = await d.store.transact(lockOf(id), async () => {
      const x = await d.coll.get(id)
      if (!x || (x.status !== 'pending' && x.status !== 'retrying') || x.owner === this.me) return { ops: [], result: null }
      const end = x.owner ? await d.owners.leaseEnd(x.owner) : null
      const now = d.clock.now()
      if (end !== null && end > now) return { ops: [], result: null }
      // A lease that expired rather than was released: its holder may only be stalled, mid-attempt. Let that attempt end first.
      const notBefore = end === null ? 0 : now + d.attemptMs + FENCE_MARGIN_MS
      const next: Delivery = { ...x, owner: this.me }
      return {
        ops: [{ type: 'put' as const, coll: d.coll as Collection<unknown>, key: id, value: next }],
        result: { from: x.owner ?? null, at: Math.max(x.nextAt ?? 0, notBefore), dest: destinationOf(x.channel) },
      }
    })
    if (!result) return false
    const w = await written
    if (!w.ok) throw w.error
    d.wait(id, result.at, result.dest)
    d.log.info({ deliveryId: id, from: result.from }, 'adopted a delivery of a stopped replica')
    return true
  }
}
