import type { FastSigner } from '../crypto/secp256k1.js'
import { channels } from '../events/channels.js'
import type { StoredAuthorization, TxRecord } from '../ledger/transactions.js'
import { decide } from '../policy/decide.js'
import { domainOf } from '../policy/domains.js'
import type { PolicyStore } from '../policy/store.js'
import type { InvocationBook, InvocationContext } from '../policy/invocations.js'
import { capHoldId, coveredByCap, hold, holdDrawn, paymentHeldAmount, type UsageState } from '../policy/usage.js'
import type { BatchOp } from '../store/index.js'
import type { Result } from '../util/result.js'
import type { PayRequest, Plan, SigningWallet } from './adapters/types.js'
import type { Balances } from './balances.js'
import type { Leases } from './leases.js'
import type { Clock } from '../util/clock.js'
import { extend } from '../util/extend.js'
import type { Recorder } from './record.js'
import type { AheadSigner } from './sign-ahead.js'

export interface ReserveDeps {
  policies: PolicyStore
  balances: Balances
  recorder: Recorder
  aheadSigner: AheadSigner
  leases: Leases
  invocations?: InvocationBook
  clock: Clock
}

type Prepared = { unsigned: StoredAuthorization; sign(): StoredAuthorization }

/** What the locked section decided. `reserved`: the hold and the pending record are being written (`written`). */
export type Reservation =
  | { kind: 'rejected'; reason: string; detail: string }
  | { kind: 'funds'; balance: bigint; available: bigint }
  | { kind: 'reserved'; rec: TxRecord; prepared: Prepared | null; signing: SigningWallet }

/**
 * The reserve stage, the engine's locked section per agent: policy, funds, signature and
 * reservation. One batch writes the hold and the record (with its authorization when signing
 * is local: signed, or its EIP-3009 fields, to be signed while the batch is written) before
 * anything leaves. A rejection is recorded in the same way. The batch is enqueued under the
 * lock (writes land in call order) and awaited by the caller after it (`written`), so the
 * agent's next payment can be decided while this one is written.
 */
export async function reserve(
  d: ReserveDeps,
  req: PayRequest,
  plan: Plan,
  base: TxRecord,
  wallet: Promise<Result<FastSigner>>,
  inv: InvocationContext | null = null,
): Promise<{ reservation: Reservation; written: Promise<Result<void>> }> {
  const { agentId } = req
  const now = base.createdAt
  // The orchestrator paying inside its own invocation draws on the invocation's cap hold: its daily budget counts that once.
  const capId = inv?.capHold && inv.orchestrator === agentId ? capHoldId(inv.id) : null
  const refuse = (reason: string, detail: string) => {
    const rejected: TxRecord = { ...base, status: 'rejected', reason, detail }
    return { ops: d.recorder.ops({ kind: 'rejected', record: rejected }), result: { kind: 'rejected', reason, detail } as Reservation }
  }
  const { result, written } = await d.recorder.usage<Reservation>(agentId, async (usage, tx) => {
    const policy = await d.policies.policyOf(agentId)
    const covered = capId ? coveredByCap(usage, capId, plan.amount) : 0n
    // Decided as of now, in the lock: a rate window must count the payments committed while
    // this one waited for it (long waits when another replica holds it), stamped after `now`.
    const decision = decide(policy, usage, { host: domainOf(req.url), amount: plan.amount, covered }, Math.max(now, d.clock.now()))
    if (!decision.ok) return refuse(decision.reason, decision.detail)
    // Then the innermost invocation's cap (checked again, and taken, once funds are known).
    const fit = inv && d.invocations ? await d.invocations.fits(inv.id, plan.amount) : { ok: true as const }
    if (!fit.ok) return refuse('budget_exceeded', fit.detail)
    // The wallet was looked up alongside; a missing one is reported only now, after the policy had its say.
    const found = await wallet
    if (!found.ok) throw found.error
    const signer = found.value
    const signing: SigningWallet = { address: signer.address, signDigest: (digest: `0x${string}`) => signer.signDigest65(digest) }
    if (plan.fromWallet) {
      // Funds: the on-chain balance less what other in-flight payments have reserved.
      const held = paymentHeldAmount(usage)
      const balance = await d.balances.balance(signer.address, plan.amount, held)
      const available = balance - held
      if (available < plan.amount) {
        const failed: TxRecord = { ...base, status: 'failed', error: 'insufficient_funds' }
        return { ops: d.recorder.ops({ kind: 'finished', record: failed }), result: { kind: 'funds', balance, available } }
      }
    }
    const input = { req, txId: base.id, wallet: signing, nowMs: now }
    const prepared = plan.signsLocally && plan.prepare ? (d.aheadSigner.take(agentId, req.url, plan, signer.address) ?? plan.prepare(input)) : null
    const authorization = prepared ? prepared.unsigned : plan.signsLocally ? await plan.authorize(input) : undefined
    const rec: TxRecord = authorization ? extend(base, { authorization }) : base
    // Leased before it can be seen on disk: the reconciler leaves it alone.
    d.leases.take(base.id)
    let capOps: BatchOp[] = []
    if (inv && d.invocations) {
      const taken = await d.invocations.holdPayment(tx, inv.id, base.id, plan.amount)
      if (!taken.ok) {
        d.leases.drop(base.id)
        return refuse('budget_exceeded', taken.detail)
      }
      capOps = taken.ops
    }
    const held: UsageState = capId ? holdDrawn(usage, { id: base.id, amount: base.amount, at: now }, capId) : hold(usage, { id: base.id, amount: base.amount, at: now })
    const ops = d.recorder.ops({ kind: 'reserved', record: rec }, [d.policies.usageOp(agentId, held), ...capOps])
    return { ops, result: { kind: 'reserved', rec, prepared, signing } }
  })
  if (result.kind === 'rejected' && channels.paymentRejected.hasSubscribers) channels.paymentRejected.publish({ agentId, transactionId: base.id, reason: result.reason })
  if (result.kind === 'reserved' && channels.paymentReserved.hasSubscribers) channels.paymentReserved.publish({ agentId, transactionId: base.id, protocol: plan.protocol, amount: plan.amount })
  return { reservation: result, written }
}
