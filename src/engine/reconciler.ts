import { Readable } from 'node:stream'
import type { Chain } from '../chain/chain.js'
import type { Logger } from '../log/index.js'
import { isEip3009, type Transactions, type TxRecord } from '../ledger/transactions.js'
import type { Clock } from '../util/clock.js'
import type { PaymentEngine } from './engine.js'

/**
 * Settles reservations whose outcome is not known (signed and sent, then refused or answer lost; or a
 * crash mid-payment): the nonce used on chain means paid (commit and record), unused
 * after `validBefore` means not paid (release). Runs at start and then periodically.
 */
export class Reconciler {
  private timer: NodeJS.Timeout | null = null
  private running: Promise<void> | null = null
  private extra: (() => Promise<unknown>)[] = []

  constructor(
    private readonly engine: PaymentEngine,
    private readonly chain: Chain,
    private readonly transactions: Transactions,
    private readonly clock: Clock,
    private readonly log: Logger,
    private readonly everyMs = 5_000,
  ) {}

  start(): void {
    this.tick()
  }

  /** Also run `fn` after each pass (another owner's leftovers to take over, on a shared store). */
  alsoEachPass(fn: () => Promise<unknown>): void {
    this.extra.push(fn)
  }

  private tick(): void {
    this.running = this.runOnce()
      .catch((e: unknown) => this.log.warn({ err: e }, 'reconciler pass failed'))
      .finally(() => {
        this.running = null
        this.timer = setTimeout(() => this.tick(), this.everyMs)
        this.timer.unref()
      })
  }

  async runOnce(): Promise<void> {
    const open: TxRecord[] = []
    for (const status of ['pending', 'unknown'] as const) for await (const r of this.transactions.all(status)) open.push(r)
    for (const r of open) {
      if (this.engine.leases.isHeld(r.id)) continue
      // Another live replica's payment is its own to finish; once its lease ends, ours to settle.
      if (r.owner && r.owner !== this.engine.locks.replicaId && (await this.engine.locks.alive(r.owner))) continue
      await this.engine.locks.run(`settle\u0000${r.id}`, () => this.settleIfOpen(r.id))
    }
    for (const fn of this.extra) await fn()
  }

  /**
   * Settles the record as it is now, if still open and not in a payment's hands. The list
   * above was read before: a payment under way then may have finished (its lease dropped once
   * its record was written), and settled again from the old state it would be recorded twice.
   * Under the lock, so two replicas that both take over a dead one's record settle it once.
   */
  private async settleIfOpen(id: string): Promise<void> {
    if (this.engine.leases.isHeld(id)) return
    const r = await this.transactions.get(id)
    if (r && (r.status === 'pending' || r.status === 'unknown')) await this.settle(r)
  }

  private async settle(r: TxRecord): Promise<void> {
    const a = r.authorization
    if (!a) {
      // Crashed before anything was signed: nothing can have been paid.
      await this.engine.recorder.finish(r, { status: 'failed', error: 'interrupted before signing' }, 'release')
      return
    }
    const nowMs = this.clock.now()
    if (!isEip3009(a)) {
      // No on-chain state to ask (an MPP intent or a rail's token): held until the merchant can no longer redeem it.
      if (a.expiresAt <= nowMs) {
        await this.engine.recorder.finish(r, { status: 'failed', error: r.error ?? 'outcome unknown; the proof expired, reservation released' }, 'release')
        this.log.info({ transactionId: r.id }, 'reconciled: an off-chain proof expired with its outcome unknown, reservation released')
      }
      return
    }
    // Released only when a block at or after validBefore shows it unused: no later block can redeem it.
    const fate = await this.chain.authorizationFate(a.from as `0x${string}`, a.nonce as `0x${string}`, BigInt(a.validBefore))
    if (fate === 'used') {
      const res = { status: r.upstreamStatus ?? 502, headers: {}, body: Readable.from([Buffer.alloc(0)]) }
      await this.engine.recorder.paid(r, res, { protocol: r.protocol ?? 'x402', rail: r.rail ?? 'stablecoin' })
      this.log.info({ transactionId: r.id }, 'reconciled: the authorization was used on chain, recorded as paid')
    } else if (fate === 'unused') {
      await this.engine.recorder.finish(r, { status: 'failed', error: r.error ?? 'authorization expired unused' }, 'release')
      this.log.info({ transactionId: r.id }, 'reconciled: the authorization expired unused, reservation released')
    }
  }

  async close(): Promise<void> {
    if (this.timer) clearTimeout(this.timer)
    this.timer = null
    await this.running
  }
}
