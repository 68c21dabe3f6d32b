import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'

interface Reading {
  /** The chain's balance, read at `at` (when the read was sent). */
  balance: bigint
  at: number
  /** `committed` for the address when the read was sent: what was committed after it is not in `balance`. */
  base: bigint
}

/**
 * What every replica committed from each wallet address (base units, a running total), in the
 * shared store (`walletSpent`, key: the lowercase address). On PostgreSQL the recorder adds a
 * payment to it in the agent's locked transaction (the one that commits the usage), and every
 * wallet belongs to one agent, so all spends of an address are written under one lock, in
 * order. The funds check, under that same lock, reads it fresh: payments of other replicas are
 * then subtracted like this process's own, with one indexed read instead of a chain read.
 */
export class WalletSpend {
  private readonly coll: Collection<string>

  constructor(store: Store) {
    this.coll = store.collection('walletSpent')
  }

  async total(address: string): Promise<bigint> {
    const v = await this.coll.get(address.toLowerCase())
    return v === undefined ? 0n : BigInt(v)
  }

  /** The write that adds `amount` to the address's total (read now: call it under the wallet's agent's lock). */
  async add(address: string, amount: bigint): Promise<BatchOp> {
    const key = address.toLowerCase()
    return { type: 'put', coll: this.coll as Collection<unknown>, key, value: ((await this.total(key)) + amount).toString() }
  }
}

/**
 * Wallet balances for the funds check, without a chain read per payment: the last chain
 * reading less what Paygate itself committed since it was sent (so the estimate only errs
 * low, unless funds leave the wallet by another route).
 *
 * - An estimate that would refuse a payment is refreshed from the chain first, so incoming
 *   funds are seen at once and a refusal is always based on a fresh reading.
 * - A reading older than `ttlMs` that still approves is used while a fresh one is fetched in
 *   the background; only past `maxStaleMs` does the payment wait for the chain. A chain busy
 *   for a moment (a block, a snapshot) then never stalls payments: the funds check runs under
 *   the agent's lock, and a read that waits holds all of that agent's payments behind it.
 * - One read per address at a time; concurrent callers share it.
 * - `shared` (replicas on PostgreSQL): "committed" is the store's total of every replica
 *   (`WalletSpend`), read fresh at each check and when a chain read is sent, instead of what
 *   this process counted; `spend()` then does nothing (the total is written with the payment,
 *   `spendOps`). Without it (LevelDB, one process) nothing changes: no store read.
 */
export class Balances {
  private readonly readings = new Map<string, Reading>()
  /** What this process committed per address, since it first read that address. */
  private readonly committed = new Map<string, bigint>()
  private readonly reads = new Map<string, Promise<Reading>>()

  private readonly ttlMs: number
  private readonly maxStaleMs: number
  private readonly onRefreshError: (e: unknown) => void
  private readonly shared: WalletSpend | null

  constructor(
    private readonly read: (address: `0x${string}`) => Promise<bigint>,
    private readonly clock: Clock,
    opts: {
      ttlMs?: number
      maxStaleMs?: number
      /** Told when a background refresh fails (the old reading stays in use until `maxStaleMs`). */
      onRefreshError?: (e: unknown) => void
      /** Replicas share the store: committed spend is read from it (see above). */
      shared?: WalletSpend
    } = {},
  ) {
    this.ttlMs = opts.ttlMs ?? 5_000
    this.maxStaleMs = opts.maxStaleMs ?? 4 * this.ttlMs
    this.onRefreshError = opts.onRefreshError ?? (() => {})
    this.shared = opts.shared ?? null
  }

  /** The wallet's balance, fresh enough to approve `need` (base units, beyond `held`). */
  async balance(address: `0x${string}`, need: bigint, held: bigint): Promise<bigint> {
    const key = address.toLowerCase()
    const r = this.readings.get(key)
    if (r) {
      const estimate = this.estimate(this.shared ? await this.shared.total(key) : this.committed.get(key), r)
      const age = this.clock.now() - r.at
      if (estimate - held >= need && age < this.maxStaleMs) {
        if (age >= this.ttlMs) this.refresh(key, address).catch(this.onRefreshError)
        return estimate
      }
    }
    const fresh = await this.refresh(key, address)
    return this.estimate(this.shared ? await this.shared.total(key) : this.committed.get(key), fresh)
  }

  /** A payment from `address` was committed (by this process; nothing to do when `shared`: see `spendOps`). */
  spend(address: string, amount: bigint): void {
    if (this.shared) return
    const key = address.toLowerCase()
    const c = this.committed.get(key)
    if (c !== undefined) this.committed.set(key, c + amount)
  }

  /** The writes that count a payment from `address` as committed, for its agent's locked transaction: only when `shared`. */
  async spendOps(address: string, amount: bigint): Promise<BatchOp[]> {
    return this.shared ? [await this.shared.add(address, amount)] : []
  }

  /** `committed`: from the address so far (every replica's when shared, else this process's). */
  private estimate(committed: bigint | undefined, r: Reading): bigint {
    return r.balance - ((committed ?? 0n) - r.base)
  }

  private refresh(key: string, address: `0x${string}`): Promise<Reading> {
    const running = this.reads.get(key)
    if (running) return running
    if (this.readings.size > 100_000) {
      this.readings.clear()
      for (const k of this.committed.keys()) if (!this.reads.has(k)) this.committed.delete(k)
    }
    if (!this.shared && !this.committed.has(key)) this.committed.set(key, 0n)
    const at = this.clock.now()
    // The committed total before the chain is asked: a payment committed in between is then subtracted (erring low), never missed.
    const sent = (base: bigint): Promise<Reading> => this.read(address).then((balance) => ({ at, base, balance }))
    const p = (this.shared ? this.shared.total(key).then(sent) : sent(this.committed.get(key)!))
      .then((r): Reading => {
        this.readings.set(key, r)
        return r
      })
      .finally(() => this.reads.delete(key))
    this.reads.set(key, p)
    return p
  }
}
