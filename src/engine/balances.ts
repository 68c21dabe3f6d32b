import type { Clock } from '../util/clock.js'

interface Reading {
  /** The chain's balance at `at`. */
  balance: bigint
  at: number
  /** What this process has committed from the wallet since that reading. */
  spent: bigint
}

/**
 * Wallet balances for the funds check, without a chain read per payment: the last chain
 * reading less what Paygate itself committed since (so the estimate only errs low, unless
 * funds leave the wallet by another route). A reading older than `ttlMs`, or an estimate
 * that would refuse a payment, is refreshed from the chain first, so incoming funds are
 * seen at once and a refusal is always based on a fresh reading.
 */
export class Balances {
  private readonly readings = new Map<string, Reading>()

  constructor(
    private readonly read: (address: `0x${string}`) => Promise<bigint>,
    private readonly clock: Clock,
    private readonly ttlMs = 5_000,
  ) {}

  /** The wallet's balance, fresh enough to approve `need` (base units, beyond `held`). */
  async balance(address: `0x${string}`, need: bigint, held: bigint): Promise<bigint> {
    const key = address.toLowerCase()
    const r = this.readings.get(key)
    const now = this.clock.now()
    if (r && now - r.at < this.ttlMs) {
      const estimate = r.balance - r.spent
      if (estimate - held >= need) return estimate
    }
    const balance = await this.read(address)
    if (this.readings.size > 100_000) this.readings.clear()
    this.readings.set(key, { balance, at: now, spent: 0n })
    return balance
  }

  /** A payment from `address` was committed. */
  spend(address: string, amount: bigint): void {
    const r = this.readings.get(address.toLowerCase())
    if (r) r.spent += amount
  }
}
