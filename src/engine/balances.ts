import type { Clock } from '../util/clock.js'

interface Reading {
  /** The chain's balance, read at `at` (when the read was sent). */
  balance: bigint
  at: number
  /** `committed` for the address when the read was sent: what was committed after it is not in `balance`. */
  base: bigint
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
 */
export class Balances {
  private readonly readings = new Map<string, Reading>()
  /** What this process committed per address, since it first read that address. */
  private readonly committed = new Map<string, bigint>()
  private readonly reads = new Map<string, Promise<Reading>>()

  private readonly ttlMs: number
  private readonly maxStaleMs: number
  private readonly onRefreshError: (e: unknown) => void

  constructor(
    private readonly read: (address: `0x${string}`) => Promise<bigint>,
    private readonly clock: Clock,
    opts: {
      ttlMs?: number
      maxStaleMs?: number
      /** Told when a background refresh fails (the old reading stays in use until `maxStaleMs`). */
      onRefreshError?: (e: unknown) => void
    } = {},
  ) {
    this.ttlMs = opts.ttlMs ?? 5_000
    this.maxStaleMs = opts.maxStaleMs ?? 4 * this.ttlMs
    this.onRefreshError = opts.onRefreshError ?? (() => {})
  }

  /** The wallet's balance, fresh enough to approve `need` (base units, beyond `held`). */
  async balance(address: `0x${string}`, need: bigint, held: bigint): Promise<bigint> {
    const key = address.toLowerCase()
    const r = this.readings.get(key)
    if (r) {
      const estimate = this.estimate(key, r)
      const age = this.clock.now() - r.at
      if (estimate - held >= need && age < this.maxStaleMs) {
        if (age >= this.ttlMs) this.refresh(key, address).catch(this.onRefreshError)
        return estimate
      }
    }
    return this.estimate(key, await this.refresh(key, address))
  }

  /** A payment from `address` was committed. */
  spend(address: string, amount: bigint): void {
    const key = address.toLowerCase()
    const c = this.committed.get(key)
    if (c !== undefined) this.committed.set(key, c + amount)
  }

  private estimate(key: string, r: Reading): bigint {
    return r.balance - ((this.committed.get(key) ?? 0n) - r.base)
  }

  private refresh(key: string, address: `0x${string}`): Promise<Reading> {
    const running = this.reads.get(key)
    if (running) return running
    if (this.readings.size > 100_000) {
      this.readings.clear()
      for (const k of this.committed.keys()) if (!this.reads.has(k)) this.committed.delete(k)
    }
    if (!this.committed.has(key)) this.committed.set(key, 0n)
    const reading = { at: this.clock.now(), base: this.committed.get(key)! }
    const p = this.read(address)
      .then((balance): Reading => {
        const r = { ...reading, balance }
        this.readings.set(key, r)
        return r
      })
      .finally(() => this.reads.delete(key))
    this.reads.set(key, p)
    return p
  }
}
