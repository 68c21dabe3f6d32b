import type { StoredAuthorization } from '../ledger/transactions.js'
import { decide } from '../policy/decide.js'
import { domainOf } from '../policy/domains.js'
import type { PolicyStore } from '../policy/store.js'
import type { Clock } from '../util/clock.js'
import { Lru } from '../util/lru.js'
import type { Wallets } from '../wallet/wallets.js'
import type { PayRequest, Plan } from './adapters/types.js'

/** A signature made ahead is used within this long, or not at all (its validity window started when it was signed). */
const MAX_AGE_MS = 1_000
const key = (agentId: string, url: string): string => `${agentId}\u0000${url}`

/**
 * Signs an agent's authorization while its request's 402 is still on the wire. When a payment
 * is the only one under way and the agent's last two payments to the same URL were made under
 * the same plan (identical 402s read to the same cached offer, and the adapter keeps one plan
 * per offer; a target whose offers are not cached, or change, is not signed for ahead), the
 * agent's policy is checked for that plan first; only if it allows the payment is the
 * authorization signed, with a fresh nonce.
 *
 * The engine uses it only for that same plan, from the same wallet, after its own policy
 * check and reservation (which run as always); anything else drops it. A signature made
 * ahead is never stored or sent unless used, so a dropped one can never be redeemed.
 */
export class AheadSigner {
  /** Per agent and URL: the last plan paid under, and whether the payment before it had the same one. */
  private readonly lastPlans = new Lru<string, { plan: Plan; stable: boolean }>(256)
  private ahead: { key: string; plan: Plan; from: string; at: number; unsigned: StoredAuthorization; signed: StoredAuthorization } | null = null

  constructor(private readonly d: { policies: PolicyStore; wallets: Wallets; clock: Clock; busy: () => boolean }) {}

  /**
   * The plan a payment to `url` is made under: once two payments in a row had the same one,
   * the next payment there may be signed ahead with it. x402 plans only: their adapter keeps
   * one plan per offer, so a match can happen (the nonce is the payer's own; no session is sold).
   */
  planned(agentId: string, url: string, plan: Plan): void {
    if (plan.protocol !== 'x402' || !plan.signsLocally || !plan.fromWallet || !plan.prepare || plan.fixedNonce) return
    const k = key(agentId, url)
    this.lastPlans.set(k, { plan, stable: this.lastPlans.get(k)?.plan === plan })
  }

  /** Called once the request's first send is written; signs on the next turn of the event loop, when nothing else is under way. */
  start(req: PayRequest): void {
    if (this.d.busy()) return
    const k = key(req.agentId, req.url)
    const last = this.lastPlans.get(k)
    if (!last?.stable) return
    setImmediate(() => {
      this.sign(k, req, last.plan).catch(() => {
        // Nothing signed ahead: the payment signs as usual and reports what is wrong.
      })
    })
  }

  private async sign(k: string, req: PayRequest, plan: Plan): Promise<void> {
    if (this.d.busy()) return
    const [policy, usage] = await Promise.all([this.d.policies.policyOf(req.agentId), this.d.policies.usageOf(req.agentId)])
    const now = this.d.clock.now()
    // The policy has its say before anything is signed, here as on the paid path.
    if (!decide(policy, usage, { host: domainOf(req.url), amount: plan.amount }, now).ok) return
    const signer = await this.d.wallets.signer(req.agentId)
    const prepared = plan.prepare!({ req, txId: '', wallet: { address: signer.address, signDigest: (d) => signer.signDigest65(d) }, nowMs: now })
    this.ahead = { key: k, plan, from: signer.address, at: now, unsigned: prepared.unsigned, signed: prepared.sign() }
  }

  /** The authorization signed ahead for a payment under `plan` from `from`, if there is one that still holds; taken once. */
  take(agentId: string, url: string, plan: Plan, from: string): { unsigned: StoredAuthorization; sign(): StoredAuthorization } | null {
    const a = this.ahead
    if (!a || a.key !== key(agentId, url)) return null
    this.ahead = null
    if (a.plan !== plan || a.from !== from || this.d.clock.now() - a.at > MAX_AGE_MS) return null
    return { unsigned: a.unsigned, sign: () => a.signed }
  }
}
