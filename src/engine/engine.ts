import type { Registry } from '../agents/registry.js'
import type { Chain } from '../chain/chain.js'
import { PaygateError } from '../errors/index.js'
import type { EventBus } from '../events/bus.js'
import type { Outbox } from '../ledger/outbox.js'
import type { RecordHooks } from '../ledger/record-hooks.js'
import { endpointOf, isEip3009, newTxId, type StoredAuthorization, type Transactions, type TxRecord } from '../ledger/transactions.js'
import type { Logger } from '../log/index.js'
import { decide, domainPermitted } from '../policy/decide.js'
import { domainOf } from '../policy/domains.js'
import type { ProtocolPreference } from '../policy/model.js'
import type { PolicyStore } from '../policy/store.js'
import type { InvocationBook } from '../policy/invocations.js'
import { countSessionCall } from '../policy/usage.js'
import { SESSION_HEADER } from '../protocols/mpp.js'
import type { HttpAnswer, PayableChain } from '../protocols/types.js'
import type { Store } from '../store/index.js'
import { CrossLocks } from '../store/leases.js'
import type { Clock } from '../util/clock.js'
import { formatUnits, toUsdcNumber } from '../util/money.js'
import { attempt, outcome } from '../util/result.js'
import type { Wallets } from '../wallet/wallets.js'
import type { MppAdapter } from './adapters/mpp.js'
import type { PayRequest, Plan, ProtocolAdapter, SigningWallet } from './adapters/types.js'
import { Balances, WalletSpend } from './balances.js'
import { deliver, type DeliverDeps } from './deliver.js'
import { Leases } from './leases.js'
import { choosePlan, detectAll, MAX_402_BODY, read402, type Choice } from './offers.js'
import { Recorder } from './record.js'
import { reserve, type ReserveDeps } from './reserve.js'
import { begin, beginCached, type StartDeps } from './start.js'
import { AheadSigner } from './sign-ahead.js'
import type { FirstAnswer, PayOptions, PayOutcome, PayStart, Relayed } from './types.js'
import { unreachable } from '../upstream/errors.js'
import type { Upstream, UpstreamResponse } from '../upstream/upstream.js'

export type { PayRequest } from './adapters/types.js'
export { relayable } from './types.js'
export type { FirstAnswer, PaymentInfo, PayOptions, PayOutcome, PayStart, Relayed } from './types.js'

export interface EngineDeps {
  store: Store
  registry: Registry
  policies: PolicyStore
  wallets: Wallets
  chain: Chain
  upstream: Upstream
  transactions: Transactions
  outbox: Outbox
  events: EventBus
  hooks: RecordHooks
  clock: Clock
  log: Logger
  /** Protocol adapters, x402 first; `mpp` is also the owner of MPP sessions. */
  adapters: readonly ProtocolAdapter[]
  mpp: MppAdapter
  /** `Accept-Payment` sent with each request that does not carry one (what Paygate can pay). */
  acceptPayment?: string
  /** Open invocations and their caps (payments with an `X-Paygate-Invocation` token). */
  invocations?: InvocationBook
  /** Locks that hold across replicas (a new set for this engine when not given). */
  locks?: CrossLocks
}

/** How far before a cut-off request's start its transaction is looked for (clock steps). */
const CUT_OFF_MARGIN_MS = 60_000
/** A session call the service refused: the session is dropped and, once, a new payment is allowed. */
const sessionRefused = (status: number): boolean => status === 401 || status === 402
const chainSilent = (e: unknown): never => {
  throw new PaygateError('unavailable', 'the chain is not answering; retry later', { headers: { 'retry-after': '2' }, cause: e })
}

/**
 * The pay flow, shared by `POST /v1/pay` and the proxy, one entry point (`pay`) and its stages
 * in order: start.ts (the lookups before the first send), the first send, then offers.ts (read
 * the 402, pick a plan), reserve.ts (policy and reservation, the locked section), deliver.ts
 * (the retry loop, ending as outcome.ts says), record.ts (every record write, with the record
 * hook). See docs/architecture.md.
 */
export class PaymentEngine {
  /** The record stage, shared with the reconciler. */
  readonly recorder: Recorder
  /** Payments this process is still working on (the reconciler skips them). */
  readonly leases = new Leases()
  private readonly balances: Balances
  /**
   * Per agent and service origin, one MPP session negotiation at a time; per agent and nonce,
   * one payment of a nonce the offer fixes. Across replicas on a shared store (store/leases.ts).
   */
  readonly locks: CrossLocks
  private readonly aheadSigner: AheadSigner
  private readonly startDeps: StartDeps
  private readonly reserveDeps: ReserveDeps
  private readonly deliverDeps: DeliverDeps

  constructor(private readonly d: EngineDeps) {
    this.locks = d.locks ?? new CrossLocks(d.store, d.clock)
    this.aheadSigner = new AheadSigner({ policies: d.policies, wallets: d.wallets, clock: d.clock, busy: () => this.leases.size > 0 })
    // Replicas: every replica's committed spend, from the store (balances.ts).
    const shared = d.store.backend === 'postgres' ? { shared: new WalletSpend(d.store) } : {}
    this.balances = new Balances((a) => d.chain.balanceOf(a), d.clock, { onRefreshError: (e) => d.log.warn({ err: e }, 'refreshing a wallet balance failed'), ...shared })
    this.recorder = new Recorder({ store: d.store, policies: d.policies, transactions: d.transactions, outbox: d.outbox, events: d.events, hooks: d.hooks, clock: d.clock, balances: this.balances })
    this.startDeps = {
      registry: d.registry,
      policies: d.policies,
      transactions: d.transactions,
      mpp: d.mpp,
      ...(d.invocations ? { invocations: d.invocations } : {}),
      ...(d.acceptPayment !== undefined ? { acceptPayment: d.acceptPayment } : {}),
    }
    this.reserveDeps = {
      policies: d.policies,
      balances: this.balances,
      recorder: this.recorder,
      aheadSigner: this.aheadSigner,
      leases: this.leases,
      clock: d.clock,
      ...(d.invocations ? { invocations: d.invocations } : {}),
    }
    this.deliverDeps = { chain: d.chain, outbox: d.outbox, recorder: this.recorder, leases: this.leases, events: d.events, clock: d.clock, bodyTimeoutMs: d.upstream.timeoutMs }
  }

  /** Sent as `Accept-Payment` with requests that carry none; a caller building headers may add it itself (saves a copy). */
  get acceptPayment(): string | undefined {
    return this.d.acceptPayment
  }

  get payable(): PayableChain {
    const { chainId, network, token, tokenDomain } = this.d.chain.info
    return { chainId, networkName: network, token, tokenDomain }
  }

  /**
   * Pay for one request: send it, and if the target answers 402, pay and retry. With
   * `options.firstSend` the caller sends the first request its own way (the proxy) and may
   * relay a plain answer to the agent itself (`Relayed`).
   */
  pay(request: PayRequest): Promise<PayOutcome>
  pay(request: PayRequest, options: PayOptions): Promise<PayOutcome | Relayed>
  async pay(request: PayRequest, options: PayOptions = {}): Promise<PayOutcome | Relayed> {
    const start = beginCached(this.startDeps, request) ?? (await begin(this.startDeps, request))
    const sending: Promise<FirstAnswer> = options.firstSend ? options.firstSend(start) : this.sendOrUnreachable(start.req, start.firstHeaders).then((response) => ({ kind: 'engine', response }))
    this.signAhead(start)
    const first = await sending
    if (first.kind === 'relayed') return { relayed: true, status: first.status }
    const response = first.kind === 'engine' ? first.response : await this.sendOrUnreachable(start.req, start.firstHeaders)
    try {
      return await this.resume(start, response)
    } catch (e) {
      // The first answer, if the engine was still reading it, goes with the failure.
      response.body.destroy()
      throw e
    }
  }

  /**
   * Call once the first request of `start` is sent: a lone payment's authorization may then be
   * signed while its 402 is on the wire (see AheadSigner). Not with an MPP session (no payment expected).
   */
  private signAhead(start: PayStart): void {
    if (start.session === null) this.aheadSigner.start(start.req)
  }

  /** Everything after the first send: session accounting, offers, policy, payment. */
  private async resume(start: PayStart, firstAnswer: UpstreamResponse): Promise<PayOutcome> {
    const { req, policy, session } = start
    const { agentId } = req
    let first = firstAnswer
    if (session) {
      if (!sessionRefused(first.status)) return this.sessionCall(agentId, req.url, first)
      await this.d.mpp.dropSession(agentId, req.url, session.token)
      if (first.status === 401) {
        first.body.resume()
        first = await this.sendOrUnreachable(req, {})
      }
    }
    if (first.status !== 402) return { response: first, payment: null }

    let got = await read402(first, this.d.upstream.timeoutMs)
    let picked = this.pick(got.answer, req, policy.protocolPreference, true)
    if ('unpaid' in picked && picked.refetch) {
      // Only expired challenges: fetch the 402 again (once) rather than pay a stale one.
      got.drop()
      const again = await this.sendOrUnreachable(req, {})
      if (again.status !== 402) return { response: again, payment: null }
      got = await read402(again, this.d.upstream.timeoutMs)
      picked = this.pick(got.answer, req, policy.protocolPreference, false)
    }
    if ('unpaid' in picked) {
      const unpaid = got.cut ? new PaygateError(picked.unpaid.code, `${picked.unpaid.detail} (its body, over ${MAX_402_BODY} bytes, was not read for offers)`) : picked.unpaid
      return { response: got.whole(), payment: null, unpaid }
    }
    got.drop()
    const { plan } = picked
    if (!plan.sellsSession) return this.payPlan(req, plan, start)

    // One negotiation per agent and service: concurrent first calls, and concurrent calls
    // whose session was refused, wait here and then ride on the session the first one bought.
    return this.locks.run(`negotiation\u0000${agentId}\u0000${new URL(req.url).origin}`, async () => {
      // As in `started` (start.ts): a blocked or not-allowed domain rides no session (payPlan then rejects it).
      const bought = domainPermitted(policy, domainOf(req.url)) ? await this.d.mpp.session(agentId, req.url) : null
      if (bought) {
        const res = await this.sendOrUnreachable(req, { [SESSION_HEADER]: bought.token })
        if (!sessionRefused(res.status)) return this.sessionCall(agentId, req.url, res)
        res.body.resume()
        await this.d.mpp.dropSession(agentId, req.url, bought.token)
      }
      return this.payPlan(req, plan, start)
    })
  }

  /** Every adapter reads the 402; the policy's preference picks among the payable (offers.ts). */
  private pick(answer: HttpAnswer, req: PayRequest, pref: ProtocolPreference, mayRefetch: boolean): Choice {
    const found = detectAll(this.d.adapters, answer, req, this.payable, (e, protocol) => this.d.log.warn({ err: e, protocol }, 'offer detection failed'))
    return choosePlan(found, pref, mayRefetch)
  }

  private sendOrUnreachable(req: PayRequest, extra: Record<string, string>): Promise<UpstreamResponse> {
    return this.d.upstream.send({ url: req.url, method: req.method, headers: { ...req.headers, ...extra }, body: req.body, timeoutMs: req.timeoutMs }).catch(unreachable)
  }

  /** A call the target served under an MPP session: no payment, counted in the agent's usage. */
  private async sessionCall(agentId: string, url: string, response: UpstreamResponse): Promise<PayOutcome> {
    await this.recorder.sessionCall(agentId, endpointOf(url), countSessionCall)
    return { response, payment: null, session: { protocol: 'mpp' } }
  }

  private payPlan(req: PayRequest, plan: Plan, start: Pick<PayStart, 'parent' | 'invocation'>): Promise<PayOutcome> {
    const nonce = plan.fixedNonce
    if (!nonce) return this.payNow(req, plan, start)
    // The offer fixes the authorization's nonce (MPP evm/charge binds it to the challenge), so
    // it can be paid once, ever: payments of one nonce take turns, and a nonce already used on
    // chain, or held by a transaction whose outcome is still open, is not signed again (else the
    // refusal that follows, or the reconciler, would count one transfer twice).
    return this.locks.run(`fixed-nonce\u0000${req.agentId}\u0000${nonce}`, async () => {
      // The policy has its say first (a rejection needs no chain); payNow decides again, under the agent's lock.
      const [policy, usage] = await Promise.all([this.d.policies.policyOf(req.agentId), this.d.policies.usageOf(req.agentId)])
      const wallet = await this.d.wallets.get(req.agentId)
      if (!wallet || !decide(policy, usage, { host: domainOf(req.url), amount: plan.amount }, this.d.clock.now()).ok) return this.payNow(req, plan, start)
      const from = wallet.address.toLowerCase()
      const same = (r: TxRecord): boolean => !!r.authorization && isEip3009(r.authorization) && r.authorization.nonce === nonce && r.authorization.from.toLowerCase() === from
      for (const status of ['pending', 'unknown'] as const) {
        for await (const r of this.d.transactions.all(status)) {
          if (r.agentId === req.agentId && same(r)) {
            throw new PaygateError('no_payable_offer', `the target's challenge is held by transaction ${r.id}, whose outcome is still open; a challenge is never paid twice`, {
              extra: { transactionId: r.id },
            })
          }
        }
      }
      if (await this.d.chain.authorizationUsed(wallet.address, nonce).catch((e: unknown) => chainSilent(e))) {
        throw new PaygateError('no_payable_offer', `the target's challenge was paid before (its authorization nonce ${nonce} is used on chain); a challenge is never paid twice`)
      }
      return this.payNow(req, plan, start)
    })
  }

  /** Reserve (reserve.ts), sign, then deliver (deliver.ts); the lease keeps the reconciler away meanwhile. */
  private async payNow(req: PayRequest, plan: Plan, start: Pick<PayStart, 'parent' | 'invocation'>): Promise<PayOutcome> {
    const { agentId } = req
    const { parent, invocation } = start
    const now = this.d.clock.now()
    const base: TxRecord = {
      id: newTxId(now),
      agentId,
      status: 'pending',
      ...(this.locks.shared ? { owner: this.locks.replicaId } : {}),
      createdAt: now,
      updatedAt: now,
      endpoint: endpointOf(req.url),
      method: req.method,
      protocol: plan.protocol,
      rail: plan.rail,
      ...(plan.paymentMethod ? { paymentMethod: plan.paymentMethod } : {}),
      amount: plan.amount.toString(),
      txHash: null,
      parentTxHash: parent?.txHash ?? null,
      depth: parent ? parent.depth + 1 : 0,
      offer: plan.offer,
      ...(req.idempotencyKey ? { idempotencyKey: req.idempotencyKey } : {}),
      ...(invocation ? { invocation: { id: invocation.id, invokers: invocation.invokers } } : {}),
    }
    this.aheadSigner.planned(agentId, req.url, plan)
    const { reservation: r, written } = await reserve(this.reserveDeps, req, plan, base, outcome(this.d.wallets.signer(agentId)), invocation ?? null)
    if (r.kind !== 'reserved') {
      const w = await written
      if (!w.ok) throw w.error
      if (r.kind === 'rejected' && r.reason === 'budget_exceeded') throw new PaygateError('budget_exceeded', r.detail, { extra: { transactionId: base.id } })
      if (r.kind === 'rejected') {
        this.d.events.emit('policy.violation', { agentId, timestamp: new Date(now).toISOString(), reason: r.reason, detail: r.detail, endpoint: base.endpoint, transactionId: base.id })
        throw new PaygateError('policy_violation', r.detail, { extra: { reason: r.reason } })
      }
      throw new PaygateError('insufficient_funds', `wallet holds ${formatUnits(r.balance)} USDC with ${formatUnits(r.balance - r.available)} reserved; ${formatUnits(plan.amount)} needed`, {
        extra: {
          required: { usdc: toUsdcNumber(plan.amount) },
          available: { usdc: toUsdcNumber(r.available > 0n ? r.available : 0n) },
        },
      })
    }
    // An EIP-3009 authorization is signed while its reservation is being written (see Plan.prepare).
    const signed = r.prepared ? attempt(() => r.prepared!.sign()) : null
    const w = await written
    if (!w.ok) {
      this.leases.drop(base.id)
      throw w.error
    }
    try {
      let rec = r.rec
      if (signed && !signed.ok) {
        // Nothing was sent: the reservation is released.
        await this.recorder.finish(rec, { status: 'failed', error: `signing failed: ${(signed.error as Error).message}` }, 'release')
        throw signed.error
      }
      if (signed) rec = { ...rec, authorization: signed.value }
      if (!rec.authorization) rec = await this.authorizeRemotely(req, plan, rec, r.signing)
      return await deliver(this.deliverDeps, req, plan, rec)
    } finally {
      this.leases.drop(base.id)
    }
  }

  /** A remote rail (card, ...) is asked only after reserving, outside the agent's lock. */
  private async authorizeRemotely(req: PayRequest, plan: Plan, rec: TxRecord, signing: SigningWallet): Promise<TxRecord> {
    let authorization: StoredAuthorization
    try {
      authorization = await plan.authorize({ req, txId: rec.id, wallet: signing, nowMs: this.d.clock.now() })
    } catch (e) {
      const err = e instanceof PaygateError ? e : new PaygateError('payment_failed', `the ${plan.rail} rail failed: ${(e as Error).message}`)
      await this.recorder.finish(rec, { status: 'failed', error: err.detail }, 'release')
      throw err
    }
    const next = { ...rec, authorization, updatedAt: this.d.clock.now() }
    await this.d.transactions.put(next, rec)
    return next
  }

  async cutOff(agentId: string, idempotencyKey: string, startedAt: number): Promise<TxRecord | undefined> {
    const rec = await this.d.transactions.findByIdempotencyKey(agentId, idempotencyKey, startedAt - CUT_OFF_MARGIN_MS)
    // Nothing that could move money left Paygate: no authorization (refused, or short of funds),
    // or an EIP-3009 one that failed unsigned (signing failed) or expired unused. An off-chain
    // proof that failed may have been redeemed: that failure stands.
    const harmless = (r: TxRecord): boolean => !r.authorization || (isEip3009(r.authorization) && r.authorization.signature === '')
    if (!rec || rec.status === 'rejected' || (rec.status === 'failed' && harmless(rec))) return undefined
    if (rec.status === 'pending' || rec.status === 'unknown') {
      throw new PaygateError('unavailable', 'a request with this idempotencyKey was cut off by a restart while paying; its payment is being settled: retry later', {
        extra: { transactionId: rec.id },
        headers: { 'retry-after': '5' },
      })
    }
    if (rec.status === 'failed') throw new PaygateError('payment_failed', rec.error ?? 'the payment failed', { extra: { transactionId: rec.id } })
    return rec
  }
}
