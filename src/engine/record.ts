import { ledgerLocation, recordIdOf, ZERO32, type LedgerEntry } from '../chain/ledger-tx.js'
import { channels } from '../events/channels.js'
import type { EventBus } from '../events/bus.js'
import type { Outbox } from '../ledger/outbox.js'
import type { RecordChange, RecordHooks } from '../ledger/record-hooks.js'
import { isEip3009, type Transactions, type TxRecord } from '../ledger/transactions.js'
import type { PolicyStore } from '../policy/store.js'
import { commit, release, usedToday, type UsageState } from '../policy/usage.js'
import type { Settlement } from '../protocols/types.js'
import type { BatchOp, Store, Txn } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { extend } from '../util/extend.js'
import { toUsdcNumber } from '../util/money.js'
import { outcome, type Result } from '../util/result.js'
import type { Plan } from './adapters/types.js'
import type { Balances } from './balances.js'
import type { PayOutcome } from './types.js'
import type { UpstreamResponse } from '../upstream/upstream.js'

const BUDGET_WARNING_PCT = 80

/** The ledger record of a paid transaction. */
export function ledgerEntryOf(rec: TxRecord, protocol: string): LedgerEntry {
  const { origin, pathHash } = ledgerLocation(rec.endpoint)
  return {
    id: recordIdOf(rec.id),
    parentTxHash: (rec.parentTxHash as `0x${string}` | null) ?? ZERO32,
    agentId: rec.agentId,
    amount: BigInt(rec.amount),
    protocol,
    origin,
    pathHash,
    depth: rec.depth,
  }
}

export interface RecorderDeps {
  store: Store
  policies: PolicyStore
  transactions: Transactions
  outbox: Outbox
  events: EventBus
  hooks: RecordHooks
  clock: Clock
  balances: Balances
}

/**
 * The record stage: every write of a transaction record and of the agent's usage beside it,
 * each in one atomic batch with what the record hook's contributors add. The engine's other
 * stages and the reconciler write records only through here.
 */
export class Recorder {
  constructor(private readonly d: RecorderDeps) {}

  /**
   * A read-modify-write of the agent's usage (the engine's locked section): `fn` reads, decides
   * and returns the batch; it is written in call order and awaited by the caller outside the
   * lock (`written`). A failure drops the cached usage so it is read again.
   */
  async usage<T>(agentId: string, fn: (usage: UsageState, tx: Txn) => Promise<{ ops: readonly BatchOp[]; result: T }>): Promise<{ result: T; written: Promise<Result<void>> }> {
    const forget = (): void => this.d.policies.forgetUsage(agentId)
    let read: UsageState | undefined
    try {
      const r = await this.d.store.transact(`usage\u0000${agentId}`, async (tx) => fn((read = await this.d.policies.usageOf(agentId)), tx))
      return {
        result: r.result,
        written: r.written.then((w) => {
          if (!w.ok) forget()
          return w
        }),
      }
    } catch (e) {
      // A refusal (a policy decision) changed nothing: the cached usage stays. It must: it holds
      // what batches still on their way to the store (an outbox group being signed) carry, and
      // read again from the store now it would lack their holds and spend.
      if (read === undefined || this.d.policies.cachedUsage(agentId) !== read) forget()
      throw e
    }
  }

  /** The operations that write `rec` as `change` describes, with the contributors' share. */
  ops(change: Exclude<RecordChange, { kind: 'session' }>, extra: readonly BatchOp[] = []): BatchOp[] {
    const prev = 'prev' in change ? change.prev : undefined
    return [...this.d.transactions.ops(change.record, prev), ...extra, ...this.d.hooks.ops(change)]
  }

  /** A call served under an MPP session: the agent's usage and the contributors' share, in one write. */
  async sessionCall(agentId: string, endpoint: string, count: (usage: UsageState, now: number) => UsageState): Promise<void> {
    const { written } = await this.usage(agentId, async (usage) => {
      const now = this.d.clock.now()
      const ops = [this.d.policies.usageOp(agentId, count(usage, now)), ...this.d.hooks.ops({ kind: 'session', agentId, at: now, endpoint })]
      return { ops, result: undefined }
    })
    const w = await written
    if (!w.ok) throw w.error
  }

  /** Close a transaction that was not paid: release (or keep) its reservation. */
  async finish(rec: TxRecord, change: Partial<TxRecord>, reservation: 'release' | 'keep'): Promise<void> {
    const next: TxRecord = { ...rec, ...change, updatedAt: this.d.clock.now() }
    const { written } = await this.usage(rec.agentId, async (usage) => {
      const extra = reservation === 'release' ? [this.d.policies.usageOp(rec.agentId, release(usage, rec.id))] : []
      return { ops: this.ops({ kind: 'finished', record: next, prev: rec }, extra), result: undefined }
    })
    const w = await written
    if (!w.ok) throw w.error
    if (rec.authorization && channels.paymentFailed.hasSubscribers) {
      channels.paymentFailed.publish({
        agentId: rec.agentId,
        transactionId: rec.id,
        protocol: rec.protocol ?? 'x402',
        rail: rec.rail ?? 'stablecoin',
        held: reservation === 'keep',
        error: next.error ?? '',
      })
    }
  }

  /**
   * Commit the reservation, write the paid record and its ledger record in one batch, emit
   * events. `entry`: the ledger entry of `rec` when the caller built it already; `settlement`:
   * the target's report of it, when the caller read it already.
   */
  async paid(
    rec: TxRecord,
    res: UpstreamResponse,
    plan: Pick<Plan, 'protocol' | 'rail'> & Partial<Pick<Plan, 'settlement'>>,
    entry?: LedgerEntry,
    settlement: Settlement | null = plan.settlement?.(res.headers) ?? null,
  ): Promise<PayOutcome> {
    const now = this.d.clock.now()
    const policy = await this.d.policies.policyOf(rec.agentId)
    await this.d.hooks.prepare(rec)
    let before = 0n
    let after = 0n
    const { result: recording } = await this.usage(rec.agentId, async (usage) => {
      before = usedToday(usage, now)
      const committed = commit(usage, rec.id, now, policy.rateLimit?.calls ?? 0)
      after = usedToday(committed, now)
      const usageOp = this.d.policies.usageOp(rec.agentId, committed)
      // On a store shared by replicas the usage is written in the lock's own transaction: the
      // outbox's batch lands after the lock is free, when another replica may already have
      // written a newer usage (a new hold) that it would overwrite. (LevelDB: `latest` writes
      // the newest cached usage whenever the batch lands.)
      const shared = this.d.store.backend === 'postgres'
      // With it, the wallet's committed total that every replica's funds check reads (balances.ts); read before the outbox takes the record.
      const spent = shared && rec.authorization && isEip3009(rec.authorization) ? await this.d.balances.spendOps(rec.authorization.from, BigInt(rec.amount)) : []
      // The outbox numbers the ledger record and writes it with these operations, in order;
      // awaited outside the agent's lock, so its next payment can be decided meanwhile.
      const pending = this.d.outbox.record(entry ?? ledgerEntryOf(rec, plan.protocol), rec.id, (hash) => {
        const next: TxRecord = extend(rec, {
          status: 'paid' as const,
          txHash: hash,
          updatedAt: now,
          upstreamStatus: res.status,
          ...(settlement
            ? { settlement: { success: settlement.success, transaction: settlement.transaction, network: settlement.network, payer: settlement.payer, errorReason: settlement.errorReason } }
            : {}),
          ledger: { status: 'queued' as const },
        })
        return this.ops({ kind: 'paid', record: next, prev: rec, usage: committed, dailyBudget: policy.dailyBudget ?? null }, shared ? [] : [usageOp])
      })
      return { ops: shared ? [usageOp, ...spent] : [], result: outcome(pending) }
    })
    const recorded = await recording
    if (!recorded.ok) {
      this.d.policies.forgetUsage(rec.agentId)
      throw recorded.error
    }
    const txHash = recorded.value
    const amount = BigInt(rec.amount)
    if (rec.authorization && isEip3009(rec.authorization)) this.d.balances.spend(rec.authorization.from, amount)
    if (channels.paymentPaid.hasSubscribers) {
      channels.paymentPaid.publish({ agentId: rec.agentId, transactionId: rec.id, protocol: plan.protocol, rail: plan.rail, amount, latencyMs: now - rec.createdAt })
    }
    const ts = new Date(now).toISOString()
    this.d.events.emit('payment.completed', {
      agentId: rec.agentId,
      timestamp: ts,
      transactionId: rec.id,
      protocol: plan.protocol,
      rail: plan.rail,
      amountUsdc: toUsdcNumber(amount),
      endpoint: rec.endpoint,
      txHash,
    })
    if (policy.dailyBudget !== undefined) this.budgetWarning(rec.agentId, ts, BigInt(policy.dailyBudget), before, after)
    return { response: res, payment: { protocol: plan.protocol, rail: plan.rail, amount, txHash, transactionId: rec.id, settlement } }
  }

  /** `budget.warning` when this payment took committed spend across 80% of the daily budget. */
  private budgetWarning(agentId: string, timestamp: string, budget: bigint, before: bigint, after: bigint): void {
    const mark = (budget * BigInt(BUDGET_WARNING_PCT)) / 100n
    if (before >= mark || after < mark) return
    this.d.events.emit('budget.warning', {
      agentId,
      timestamp,
      threshold: BUDGET_WARNING_PCT,
      usedPct: Number((after * 10000n) / budget) / 100,
      usedUsdc: toUsdcNumber(after),
      dailyBudgetUsdc: toUsdcNumber(budget),
    })
  }
}
