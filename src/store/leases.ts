import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { type Clock, systemClock } from '../util/clock.js'
import { KeyedMutex } from '../util/mutex.js'
import type { Collection, Store } from './types.js'

/** A lease row: who holds a name, until when (ms on the holders' clocks). */
interface LeaseRow {
  owner: string
  until: number
}

export interface LeaseOptions {
  /** A holder that stops renewing (a killed replica) loses the lease after this long. Default 15 s. */
  ttlMs?: number
  /** First wait between claims of a held lease; it grows to `maxPollMs`. Default 10 ms. */
  pollMs?: number
  maxPollMs?: number
}

/**
 * Locks that span replicas for sections that last as long as a network call (an MPP
 * negotiation, a fixed-nonce payment, an idempotency key's first run). On LevelDB one process
 * owns the data, so they are the store's in-process lock. On PostgreSQL a holder writes a lease row
 * (claimed under the name's advisory transaction lock, so two replicas never both claim it),
 * renews it while it works, and deletes it when done; a waiter polls with backoff. A holder
 * that dies loses its lease after `ttlMs`, and the next claimant finds what it left behind.
 * Unlike a session advisory lock, a holder keeps no database connection while it works, so
 * nested and long sections cannot exhaust a pool.
 */
export class CrossLocks {
  /** This process's identity as a lease owner (a new one each start). */
  readonly replicaId: string
  private readonly local = new KeyedMutex()
  private readonly rows: Collection<LeaseRow> | null
  private readonly ttlMs: number
  private readonly pollMs: number
  private readonly maxPollMs: number
  private seq = 0

  constructor(
    private readonly store: Store,
    private readonly clock: Clock = systemClock,
    opts: LeaseOptions = {},
  ) {
    this.replicaId = randomUUID()
    this.rows = store.backend === 'postgres' ? store.collection<LeaseRow>('leases') : null
    this.ttlMs = opts.ttlMs ?? 15_000
    this.pollMs = opts.pollMs ?? 10
    this.maxPollMs = opts.maxPollMs ?? 200
  }

  /** Whether other processes share the store (and leases are rows, not only mutexes). */
  get shared(): boolean {
    return this.rows !== null
  }

  /** Run `fn` holding `name` in every replica. */
  run<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const rows = this.rows
    // One process owns a LevelDB store: the store's own lock (shared by whoever holds the store) is enough.
    if (!rows) return this.store.transact(`lease:${name}`, async () => ({ ops: [], result: await fn() })).then((r) => r.result)
    // Same-name callers of this process queue here, so only one of them polls the database.
    return this.local.run(name, async () => {
      const token = `${this.replicaId}:${++this.seq}`
      await this.claim(rows, name, token)
      const renew = setInterval(() => void this.write(rows, name, token, 'renew').catch(() => undefined), Math.max(50, Math.floor(this.ttlMs / 3)))
      renew.unref()
      try {
        return await fn()
      } finally {
        clearInterval(renew)
        await this.write(rows, name, token, 'release').catch(() => undefined)
      }
    })
  }

  /**
   * Hold this replica's own lease (`replica:<id>`) until the returned stop is called: while it
   * is live, other replicas leave the work this one owns (in-flight payments) to it.
   */
  holdReplicaLease(): () => Promise<void> {
    if (!this.rows) return async () => {}
    let stop!: () => void
    const stopped = new Promise<void>((r) => (stop = r))
    const held = this.run(`replica\x00${this.replicaId}`, () => stopped).catch(() => undefined)
    return async () => {
      stop()
      await held
    }
  }

  /** Whether `replicaId` (another replica) still holds its lease; always false on an unshared store. */
  async alive(replicaId: string): Promise<boolean> {
    const end = await this.leaseEnd(replicaId)
    return end !== null && end > this.clock.now()
  }

  /** When `replicaId`'s lease ends or ended (its last renewal plus the TTL); null when released (a graceful stop) or never held, or on an unshared store. */
  async leaseEnd(replicaId: string): Promise<number | null> {
    const row = this.rows ? await this.rows.get(`replica\x00${replicaId}`) : undefined
    return row ? row.until : null
  }

  private async claim(rows: Collection<LeaseRow>, name: string, token: string): Promise<void> {
    let wait = this.pollMs
    while (!(await this.write(rows, name, token, 'claim'))) {
      await sleep(wait)
      wait = Math.min(this.maxPollMs, Math.ceil(wait * 1.5))
    }
  }

  /** Claim (when free or expired), renew or release (when still ours) the lease row; whether it is ours after. */
  private async write(rows: Collection<LeaseRow>, name: string, token: string, op: 'claim' | 'renew' | 'release'): Promise<boolean> {
    const { result, written } = await this.store.transact(`lease:${name}`, async () => {
      const cur = await rows.get(name)
      const ours = cur?.owner === token
      const free = !cur || cur.until <= this.clock.now()
      if (op === 'release') return { ops: ours ? [{ type: 'del' as const, coll: rows, key: name }] : [], result: false }
      if (!ours && !(op === 'claim' && free)) return { ops: [], result: false }
      return { ops: [{ type: 'put' as const, coll: rows, key: name, value: { owner: token, until: this.clock.now() + this.ttlMs } }], result: true }
    })
    const w = await written
    if (!w.ok) throw w.error
    return result
  }
}
