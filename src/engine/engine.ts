import { Readable } from 'node:stream'
import type { Registry } from '../agents/registry.js'
import type { Chain } from '../chain/chain.js'
import { ledgerLocation, recordIdOf, ZERO32, type LedgerEntry } from '../chain/ledger-tx.js'
import { PaygateError, type ErrorCode } from '../errors/index.js'
import type { EventBus } from '../events/bus.js'
import { endpointOf, isEip3009, newTxId, type StoredAuthorization, type Transactions, type TxRecord } from '../ledger/transactions.js'
import type { Outbox } from '../ledger/outbox.js'
import type { Logger } from '../log/index.js'
import { decide, domainPermitted, pickProtocol } from '../policy/decide.js'
import { domainOf } from '../policy/domains.js'
import type { ProtocolPreference, StoredPolicy } from '../policy/model.js'
import type { PolicyStore } from '../policy/store.js'
import type { MppSession } from './sessions.js'
import type { Store } from '../store/index.js'
import { commit, countSessionCall, heldAmount, hold, release, usedToday } from '../policy/usage.js'
import { SESSION_HEADER } from '../protocols/mpp.js'
import type { HttpAnswer, PayableChain, ProtocolName, Settlement } from '../protocols/types.js'
import type { Clock } from '../util/clock.js'
import { formatUnits, toUsdcNumber } from '../util/money.js'
import { collectUpTo, headThen } from '../util/collect.js'
import { KeyedMutex } from '../util/mutex.js'
import type { Wallets } from '../wallet/wallets.js'
import type { MppAdapter } from './adapters/mpp.js'
import { Balances } from './balances.js'
import type { Delivery, PayRequest, Plan, ProtocolAdapter, SigningWallet } from './adapters/types.js'
import { AheadSigner } from './sign-ahead.js'
import { bodyDeadline, readBody, unreachable, type Upstream, type UpstreamResponse } from './upstream.js'

export type { PayRequest } from './adapters/types.js'

export interface PaymentInfo {
  protocol: ProtocolName
  /** `stablecoin`, `card`, or another MPP rail. */
  rail: string
  amount: bigint
  txHash: string
  transactionId: string
  settlement: Settlement | null
}

/**
 * What the target answered, and the payment made for it, if any. `unpaid` explains a 402
 * Paygate could not pay (no known shape, nothing payable here): the proxy passes such an
 * answer through, `POST /v1/pay` turns it into an error. `session`: served under an MPP
 * session bought earlier, with no payment.
 */
export interface PayOutcome {
  response: UpstreamResponse
  payment: PaymentInfo | null
  unpaid?: PaygateError
  session?: { protocol: 'mpp' }
  /**
   * A payment was sent but the target answered 400 or more and the chain does not show it
   * settled: nothing is paid now, and the reservation stays held until the authorization expires.
   */
  held?: { transactionId: string }
}

/** What `begin` looked up for one request; `resume` carries on from it. */
export interface PayStart {
  /** The request as sent (with `Accept-Payment` when the agent sent none). */
  req: PayRequest
  parent: TxRecord | null
  policy: StoredPolicy
  session: MppSession | null
  /** Sent with the first attempt only (the MPP session token). */
  firstHeaders: Readonly<Record<string, string>>
}

const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({})

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
  clock: Clock
  log: Logger
  /** Protocol adapters, x402 first; `mpp` is also the owner of MPP sessions. */
  adapters: readonly ProtocolAdapter[]
  mpp: MppAdapter
  /** `Accept-Payment` sent with each request that does not carry one (what Paygate can pay). */
  acceptPayment?: string
}

const MAX_402_BODY = 256 * 1024
const MAX_ATTEMPTS = 3
/** An authorization this close to expiry is not resent. */
const RESEND_MARGIN_MS = 6_000
const BUDGET_WARNING_PCT = 80
/** How far before a cut-off request's start its transaction is looked for (clock steps). */
const CUT_OFF_MARGIN_MS = 60_000

/** The ledger record of a paid transaction. */
function ledgerEntryOf(rec: TxRecord, protocol: string): LedgerEntry {
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

/**
 * A 402 as the adapters read it: its body up to MAX_402_BODY. A longer body is not read for
 * offers (offers in headers still are, so a large HTML page never hides them) and is passed
 * on whole (`whole`) when the 402 is not paid, or dropped (`drop`) when it is.
 */
async function read402(res: UpstreamResponse, deadlineMs: number): Promise<{ answer: HttpAnswer; cut: boolean; whole(): UpstreamResponse; drop(): void }> {
  const { head, rest } = await collectUpTo(res.body, MAX_402_BODY, undefined, bodyDeadline(deadlineMs)).catch(unreachable)
  return {
    answer: { status: 402, headers: res.headers, body: rest ? Buffer.alloc(0) : head },
    cut: rest !== null,
    whole: () => ({ status: 402, headers: res.headers, body: rest ? headThen(head, rest) : Readable.from([head]) }),
    drop: () => rest?.destroy(),
  }
}

const lostAnswer = (): UpstreamResponse => ({ status: 502, headers: { 'content-type': 'application/json' }, body: Readable.from([Buffer.from('{"error":"upstream_answer_lost"}')]) })
/** A session call the service refused: the session is dropped and, once, a new payment is allowed. */
const sessionRefused = (status: number): boolean => status === 401 || status === 402
type Result<T> = { ok: true; value: T } | { ok: false; error: unknown }
/** A promise's result as a value, so it can be awaited later (outside a lock) without an unhandled rejection. */
const outcome = <T>(p: Promise<T>): Promise<Result<T>> =>
  p.then(
    (value) => ({ ok: true as const, value }),
    (error: unknown) => ({ ok: false as const, error }),
  )
/** The same for a synchronous call, so its failure can be handled after an await. */
function attempt<T>(fn: () => T): Result<T> {
  try {
    return { ok: true, value: fn() }
  } catch (error) {
    return { ok: false, error }
  }
}
const chainSilent = (e: unknown): never => {
  throw new PaygateError('unavailable', 'the chain is not answering; retry later', {}, { 'retry-after': '2' }, e)
}
const expiryMs = (a: StoredAuthorization): number => (isEip3009(a) ? Number(a.validBefore) * 1000 : a.expiresAt)

/**
 * The pay flow, shared by `POST /v1/pay` and the proxy: send → 402? → detect offers →
 * policy + reservation → sign → retry (same authorization on transient failures, after
 * checking the chain) → record (local record + ledger outbox in one batch) → events.
 */
export class PaymentEngine {
  private readonly usageLock = new KeyedMutex()
  private readonly balances: Balances
  /** Per agent and service origin: one MPP session negotiation at a time. */
  private readonly negotiations = new KeyedMutex()
  /** Payments whose nonce the offer fixes, one at a time per agent and nonce. */
  private readonly fixedNonces = new KeyedMutex()
  /** Transactions whose outcome this process is still working on (the reconciler skips them). */
  readonly inFlight = new Set<string>()
  private readonly aheadSigner: AheadSigner

  constructor(private readonly d: EngineDeps) {
    this.aheadSigner = new AheadSigner({ policies: d.policies, wallets: d.wallets, clock: d.clock, busy: () => this.inFlight.size > 0 })
    this.balances = new Balances((a) => d.chain.balanceOf(a), d.clock, { onRefreshError: (e) => d.log.warn({ err: e }, 'refreshing a wallet balance failed') })
  }

  /** Run under the agent's usage lock; a failed write drops the cached usage so it is re-read. */
  private withUsage<T>(agentId: string, fn: () => Promise<T>): Promise<T> {
    return this.usageLock.run(agentId, async () => {
      try {
        return await fn()
      } catch (e) {
        this.d.policies.forgetUsage(agentId)
        throw e
      }
    })
  }

  /** Sent as `Accept-Payment` with requests that carry none; a caller building headers may add it itself (saves a copy). */
  get acceptPayment(): string | undefined {
    return this.d.acceptPayment
  }

  get payable(): PayableChain {
    const { chainId, network, token, tokenDomain } = this.d.chain.info
    return { chainId, networkName: network, token, tokenDomain }
  }

  async pay(request: PayRequest): Promise<PayOutcome> {
    const start = this.beginCached(request) ?? (await this.begin(request))
    const first = this.sendOrUnreachable(start.req, start.firstHeaders)
    this.signAhead(start)
    return this.resume(start, await first)
  }

  /**
   * Call once the first request of `start` is sent: a lone payment's authorization may then be
   * signed while its 402 is on the wire (see AheadSigner). Not with an MPP session (no payment expected).
   */
  signAhead(start: PayStart): void {
    if (start.session === null) this.aheadSigner.start(start.req)
  }

  /**
   * The lookups before the first send: the agent, the parent, the policy and a valid MPP
   * session. The proxy sends the first request itself (its own keep-alive path) with
   * `req.headers` plus `firstHeaders`, and hands the answer to `resume` unless it can
   * relay it untouched (`relayable`).
   */
  async begin(request: PayRequest): Promise<PayStart> {
    const { agentId } = request
    await this.d.registry.requireAgent(agentId)
    const parent = request.parentTxHash ? await this.parentOf(request.parentTxHash, agentId) : null
    const policy = await this.d.policies.policyOf(agentId)
    return this.started(request, parent, policy, await this.d.mpp.session(agentId, request.url, request.origin))
  }

  /** `begin` from memory alone, or null when a lookup would need the store (then call `begin`). */
  beginCached(request: PayRequest): PayStart | null {
    const { agentId } = request
    if (request.parentTxHash || !this.d.registry.cachedAgent(agentId)) return null
    const policy = this.d.policies.cachedPolicy(agentId)
    const session = policy && this.d.mpp.cachedSession(agentId, request.url, request.origin)
    return policy && session !== undefined ? this.started(request, null, policy, session) : null
  }

  private started(request: PayRequest, parent: TxRecord | null, policy: StoredPolicy, found: MppSession | null): PayStart {
    let req = request
    // A valid MPP session with this service is sent along: no payment if the target takes it.
    const session = found && domainPermitted(policy, domainOf(req.url)) ? found : null
    if (this.d.acceptPayment && req.headers['accept-payment'] === undefined) req = { ...req, headers: { ...req.headers, 'accept-payment': this.d.acceptPayment } }
    return { req, parent, policy, session, firstHeaders: session ? { [SESSION_HEADER]: session.token } : NO_HEADERS }
  }

  /** A first answer that needs nothing from the engine: no 402, no session to account for. */
  static relayable(start: PayStart, status: number): boolean {
    return status !== 402 && start.session === null
  }

  /**
   * Outbox.signAhead for `rec`, returning the entry for paid() to record; never throws (a
   * record that cannot be built fails in paid(), as before).
   */
  private signLedgerAhead(rec: TxRecord, protocol: ProtocolName): LedgerEntry | undefined {
    try {
      const entry = ledgerEntryOf(rec, protocol)
      this.d.outbox.signAhead(entry)
      return entry
    } catch {
      return undefined // nothing signed ahead
    }
  }

  /** Everything after the first send: session accounting, offers, policy, payment. */
  async resume(start: PayStart, firstAnswer: UpstreamResponse): Promise<PayOutcome> {
    const { req, parent, policy, session } = start
    const { agentId } = req
    let first = firstAnswer
    if (session) {
      if (!sessionRefused(first.status)) return this.sessionCall(agentId, first)
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
    if (!plan.sellsSession) return this.payPlan(req, plan, parent)

    // One negotiation per agent and service: concurrent first calls, and concurrent calls
    // whose session was refused, wait here and then ride on the session the first one bought.
    return this.negotiations.run(`${agentId}\u0000${new URL(req.url).origin}`, async () => {
      const bought = await this.d.mpp.session(agentId, req.url)
      if (bought) {
        const res = await this.sendOrUnreachable(req, { [SESSION_HEADER]: bought.token })
        if (!sessionRefused(res.status)) return this.sessionCall(agentId, res)
        res.body.resume()
        await this.d.mpp.dropSession(agentId, req.url, bought.token)
      }
      return this.payPlan(req, plan, parent)
    })
  }

  /** Every adapter reads the 402 (one failing never hides another); the policy's preference picks among the payable. */
  private pick(answer: HttpAnswer, req: PayRequest, pref: ProtocolPreference, mayRefetch: boolean): { plan: Plan } | { unpaid: PaygateError; refetch?: boolean } {
    const chain = this.payable
    const plans = new Map<ProtocolName, Plan>()
    const problems: string[] = []
    let present = 0
    let malformed = 0
    const expired = new Set<ProtocolName>()
    for (const adapter of this.d.adapters) {
      let d
      try {
        d = adapter.detect(answer, req, chain)
      } catch (e) {
        this.d.log.warn({ err: e, protocol: adapter.protocol }, 'offer detection failed')
        continue
      }
      if (!d.present) continue
      present++
      // Adapters of one protocol (MPP's two shapes) are asked in order; the first payable one wins.
      if (d.plan && d.plan.amount === 0n) {
        // Nothing to pay, yet paying would sign an authorization and cost a ledger record.
        problems.push(`an offer of 0 USDC (${adapter.protocol}), which Paygate does not pay`)
      } else if (d.plan) {
        if (!plans.has(adapter.protocol)) plans.set(adapter.protocol, d.plan)
      } else {
        problems.push(d.why)
        if (d.malformed) malformed++
        if (d.expired) expired.add(adapter.protocol)
      }
    }
    // The preferred protocol offered only expired challenges: fetch fresh ones rather than fall back.
    const preferred = pickProtocol(pref, ['x402', 'mpp'])!
    if (mayRefetch && expired.has(preferred) && !plans.has(preferred)) return { unpaid: new PaygateError('no_payable_offer', 'expired challenges'), refetch: true }
    const chosen = pickProtocol(pref, [...plans.keys()])
    if (chosen) return { plan: plans.get(chosen)! }
    if (present === 0) return { unpaid: new PaygateError('payment_protocol_error', 'the target answered 402 without a payment requirement in any known shape') }
    if (malformed === present) return { unpaid: new PaygateError('payment_protocol_error', `the target's 402 cannot be read: ${problems.join('; ')}`) }
    return { unpaid: new PaygateError('no_payable_offer', `the target's 402 has ${problems.join('; ')}`), ...(mayRefetch && expired.size > 0 ? { refetch: true } : {}) }
  }

  /** A call the target served under an MPP session: no payment, counted in the agent's usage. */
  private async sessionCall(agentId: string, response: UpstreamResponse): Promise<PayOutcome> {
    await this.withUsage(agentId, async () => {
      const usage = await this.d.policies.usageOf(agentId)
      await this.d.store.batch([this.d.policies.usageOp(agentId, countSessionCall(usage, this.d.clock.now()))])
    })
    return { response, payment: null, session: { protocol: 'mpp' } }
  }

  /** A payment hangs only under the paying agent's own transactions: another agent's tree is not its to grow. */
  private async parentOf(hash: string, agentId: string): Promise<TxRecord> {
    const p = await this.d.transactions.find(hash)
    if (!p || !p.txHash) throw new PaygateError('invalid_request', `parentTxHash ${hash} is not a known transaction`, { field: 'parentTxHash' })
    if (p.agentId !== agentId) throw new PaygateError('invalid_request', `parentTxHash ${hash} is not a transaction of agent ${agentId}`, { field: 'parentTxHash' })
    return p
  }

  private sendOrUnreachable(req: PayRequest, extra: Record<string, string>): Promise<UpstreamResponse> {
    return this.d.upstream.send({ url: req.url, method: req.method, headers: { ...req.headers, ...extra }, body: req.body }).catch(unreachable)
  }

  private payPlan(req: PayRequest, plan: Plan, parent: TxRecord | null): Promise<PayOutcome> {
    const nonce = plan.fixedNonce
    if (!nonce) return this.payNow(req, plan, parent)
    // The offer fixes the authorization's nonce (MPP evm/charge binds it to the challenge), so
    // it can be paid once, ever: payments of one nonce take turns, and a nonce already used on
    // chain, or held by a transaction whose outcome is still open, is not signed again (else the
    // refusal that follows, or the reconciler, would count one transfer twice).
    return this.fixedNonces.run(`${req.agentId}\u0000${nonce}`, async () => {
      // The policy has its say first (a rejection needs no chain); payNow decides again, under the agent's lock.
      const [policy, usage] = await Promise.all([this.d.policies.policyOf(req.agentId), this.d.policies.usageOf(req.agentId)])
      const wallet = await this.d.wallets.get(req.agentId)
      if (!wallet || !decide(policy, usage, { host: domainOf(req.url), amount: plan.amount }, this.d.clock.now()).ok) return this.payNow(req, plan, parent)
      const from = wallet.address.toLowerCase()
      const same = (r: TxRecord): boolean => !!r.authorization && isEip3009(r.authorization) && r.authorization.nonce === nonce && r.authorization.from.toLowerCase() === from
      for (const status of ['pending', 'unknown'] as const) {
        for await (const r of this.d.transactions.all(status)) {
          if (r.agentId === req.agentId && same(r)) {
            throw new PaygateError('no_payable_offer', `the target's challenge is held by transaction ${r.id}, whose outcome is still open; a challenge is never paid twice`, { transactionId: r.id })
          }
        }
      }
      if (await this.authorizationUsed(wallet.address, nonce).catch((e: unknown) => chainSilent(e))) {
        throw new PaygateError('no_payable_offer', `the target's challenge was paid before (its authorization nonce ${nonce} is used on chain); a challenge is never paid twice`)
      }
      return this.payNow(req, plan, parent)
    })
  }

  private async payNow(req: PayRequest, plan: Plan, parent: TxRecord | null): Promise<PayOutcome> {
    const { agentId } = req
    const now = this.d.clock.now()
    const base: TxRecord = {
      id: newTxId(now),
      agentId,
      status: 'pending',
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
    }
    this.aheadSigner.planned(agentId, req.url, plan)
    // The wallet is looked up alongside, but a missing one is reported only after the policy
    // has had its say (a blocked domain is a policy rejection, wallet or not).
    const wallet = outcome(this.d.wallets.signer(agentId))

    // Policy, funds, signature and reservation, atomically per agent: one batch writes the
    // hold and the record (with its authorization when signing is local: signed, or its
    // EIP-3009 fields, signed while the batch is written) before anything leaves.
    const reserved = await this.withUsage(agentId, async () => {
      const [policy, usage] = await Promise.all([this.d.policies.policyOf(agentId), this.d.policies.usageOf(agentId)])
      const decision = decide(policy, usage, { host: domainOf(req.url), amount: plan.amount }, now)
      if (!decision.ok) {
        await this.d.transactions.put({ ...base, status: 'rejected', reason: decision.reason, detail: decision.detail })
        return { kind: 'rejected' as const, reason: decision.reason, detail: decision.detail }
      }
      const found = await wallet
      if (!found.ok) throw found.error
      const signer = found.value
      const signing: SigningWallet = { address: signer.address, signDigest: (d: `0x${string}`) => signer.signDigest65(d) }
      if (plan.fromWallet) {
        // Funds: the on-chain balance less what other in-flight payments have reserved.
        const held = heldAmount(usage)
        const balance = await this.balances.balance(signer.address, plan.amount, held)
        const available = balance - held
        if (available < plan.amount) {
          await this.d.transactions.put({ ...base, status: 'failed', error: 'insufficient_funds' })
          return { kind: 'funds' as const, balance, available }
        }
      }
      const input = { req, txId: base.id, wallet: signing, nowMs: now }
      const prepared = plan.signsLocally && plan.prepare ? (this.aheadSigner.take(agentId, req.url, plan, signer.address) ?? plan.prepare(input)) : null
      const authorization = prepared ? prepared.unsigned : plan.signsLocally ? await plan.authorize(input) : undefined
      const rec: TxRecord = { ...base, ...(authorization ? { authorization } : {}) }
      // Enqueued under the lock (writes land in call order), awaited after it, so the
      // agent's next payment can be decided while this one is being written.
      // In flight before it can be seen on disk: the reconciler leaves it alone.
      this.inFlight.add(base.id)
      const written = outcome(this.d.store.batch([this.d.policies.usageOp(agentId, hold(usage, { id: base.id, amount: base.amount, at: now })), ...this.d.transactions.ops(rec)]))
      return { kind: 'reserved' as const, rec, written, prepared, signing }
    })
    if (reserved.kind === 'rejected') {
      this.d.events.emit('policy.violation', { agentId, timestamp: new Date(now).toISOString(), reason: reserved.reason, detail: reserved.detail, endpoint: base.endpoint, transactionId: base.id })
      throw new PaygateError('policy_violation', reserved.detail, { reason: reserved.reason })
    }
    if (reserved.kind === 'funds') {
      const { balance, available } = reserved
      throw new PaygateError('insufficient_funds', `wallet holds ${formatUnits(balance)} USDC with ${formatUnits(balance - available)} reserved; ${formatUnits(plan.amount)} needed`, {
        required: { usdc: toUsdcNumber(plan.amount) },
        available: { usdc: toUsdcNumber(available > 0n ? available : 0n) },
      })
    }
    // An EIP-3009 authorization is signed while its reservation is being written (see Plan.prepare).
    const { prepared, signing } = reserved
    const signed = prepared ? attempt(() => prepared.sign()) : null
    const written = await reserved.written
    if (!written.ok) {
      this.inFlight.delete(base.id)
      this.d.policies.forgetUsage(agentId)
      throw written.error
    }
    try {
      let rec = reserved.rec
      if (signed && !signed.ok) {
        // Nothing was sent: the reservation is released.
        await this.finish(rec, { status: 'failed', error: `signing failed: ${(signed.error as Error).message}` }, 'release')
        throw signed.error
      }
      if (signed) rec = { ...rec, authorization: signed.value }
      if (!rec.authorization) {
        // A remote rail (card, ...) is asked only now, outside the agent's lock.
        let authorization: StoredAuthorization
        try {
          authorization = await plan.authorize({ req, txId: rec.id, wallet: signing, nowMs: this.d.clock.now() })
        } catch (e) {
          const err = e instanceof PaygateError ? e : new PaygateError('payment_failed', `the ${plan.rail} rail failed: ${(e as Error).message}`)
          await this.finish(rec, { status: 'failed', error: err.detail }, 'release')
          throw err
        }
        const next = { ...rec, authorization, updatedAt: this.d.clock.now() }
        await this.d.transactions.put(next, rec)
        rec = next
      }
      return await this.deliver(req, plan, rec)
    } finally {
      this.inFlight.delete(base.id)
    }
  }

  /**
   * Send the payment; on a transient failure resend the SAME authorization once the chain
   * says it was not used; never a second one. Proofs with no on-chain state are resent
   * as they are (the merchant dedupes them) and kept held when the outcome stays unknown.
   */
  private async deliver(req: PayRequest, plan: Plan, signed: TxRecord): Promise<PayOutcome> {
    const auth = signed.authorization!
    const onChain = isEip3009(auth)
    let rec = signed
    let last: { response: UpstreamResponse | null; error: string } = { response: null, error: '' }
    let used: boolean | null = null
    let code: ErrorCode = 'payment_failed'
    /** The ledger entry built to sign it ahead, recorded as it is when paid. */
    let entry: LedgerEntry | undefined
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      rec = { ...rec, attempts: attempt }
      let d: Delivery
      try {
        const sending = plan.deliver(req, auth, rec.id)
        // The only payment under way: its ledger record is signed while the retry is on the wire.
        if (attempt === 1 && this.inFlight.size === 1) entry = this.signLedgerAhead(rec, plan.protocol)
        d = await sending
      } catch (e) {
        d = { kind: 'transient', response: null, error: (e as Error).message }
      }
      if (d.kind === 'served') {
        // An off-chain proof has no chain to ask: served is paid. An on-chain one is paid when the
        // answer reports its settlement (x402's PAYMENT-RESPONSE, MPP's receipt) or the chain shows
        // it used; a 2xx that reports nothing is not proof (the target may settle later, or never).
        if (!onChain) return this.paid(rec, d.response, plan, entry)
        if (d.response.status < 400 || plan.paidWhenServed) {
          const settlement = plan.settlement(d.response.headers)
          if (settlement?.success) return this.paid(rec, d.response, plan, entry, settlement)
        }
        const settled = await this.used(auth).catch(() => null)
        if (settled === true) return this.paid(rec, d.response, plan, entry)
        // Not settled, or the chain cannot say: the target holds a valid authorization it may still
        // redeem, so the reservation stays held until validBefore (the reconciler commits or releases it).
        const why = settled === false ? 'the authorization is not used on chain' : 'the chain could not say whether it settled'
        await this.finish(rec, { status: 'unknown', error: `the target answered ${d.response.status} and ${why}`, upstreamStatus: d.response.status }, 'keep')
        return { response: d.response, payment: null, held: { transactionId: rec.id } }
      }
      // Refused, 5xx or no answer: the chain says whether the money moved.
      used = onChain ? await this.used(auth).catch(() => null) : null
      if (used === true) return this.paid(rec, d.response ?? lostAnswer(), plan, entry)
      last = { response: null, error: d.error }
      if (d.kind === 'refused' && d.code) code = d.code
      if (d.response) {
        const body = await readBody(d.response.body, MAX_402_BODY, this.d.upstream.timeoutMs).catch(() => Buffer.alloc(0))
        last = { response: { status: d.response.status, headers: d.response.headers, body: Readable.from([body]) }, error: `${d.error}: ${body.toString('utf8', 0, 200)}` }
      }
      // Refused outright: resending the same proof will not help.
      if (d.kind === 'refused' && (used === false || !onChain)) break
      if (expiryMs(auth) - this.d.clock.now() <= RESEND_MARGIN_MS) break
    }
    // Not paid as far as we know. But the authorization was sent: whatever the target answered
    // (a refusal included), it may still redeem it until it expires, so the reservation stays held
    // and the reconciler commits it if it lands, or releases it once the chain proves it unused.
    if (onChain) used = await this.used(auth).catch(() => null)
    if (used === true) return this.paid(rec, last.response ?? lostAnswer(), plan, entry)
    const upstreamStatus = last.response ? { upstreamStatus: last.response.status } : {}
    if (used === null || expiryMs(auth) > this.d.clock.now()) await this.finish(rec, { status: 'unknown', error: last.error, ...upstreamStatus }, 'keep')
    else await this.finish(rec, { status: 'failed', error: last.error, ...upstreamStatus }, 'release')
    this.d.events.emit('payment.failed', { agentId: rec.agentId, timestamp: new Date().toISOString(), transactionId: rec.id, error: last.error, endpoint: rec.endpoint })
    throw new PaygateError(code, `payment not completed after ${rec.attempts ?? MAX_ATTEMPTS} attempts: ${last.error}`, { transactionId: rec.id })
  }

  /**
   * What a request made under `idempotencyKey` (started at `startedAt`, then cut off by a crash)
   * did, for its replay: the paid transaction; undefined when nothing was sent (no transaction,
   * or refused before sending: the request may run again). Still settling: 503, retry later;
   * sent and failed: payment_failed.
   */
  async cutOff(agentId: string, idempotencyKey: string, startedAt: number): Promise<TxRecord | undefined> {
    const rec = await this.d.transactions.findByIdempotencyKey(agentId, idempotencyKey, startedAt - CUT_OFF_MARGIN_MS)
    // Nothing that could move money left Paygate: no authorization (refused, or short of funds),
    // or an EIP-3009 one that failed unsigned (signing failed) or expired unused. An off-chain
    // proof that failed may have been redeemed: that failure stands.
    const harmless = (r: TxRecord): boolean => !r.authorization || (isEip3009(r.authorization) && r.authorization.signature === '')
    if (!rec || rec.status === 'rejected' || (rec.status === 'failed' && harmless(rec))) return undefined
    if (rec.status === 'pending' || rec.status === 'unknown') {
      throw new PaygateError('unavailable', 'a request with this idempotencyKey was cut off by a restart while paying; its payment is being settled: retry later', { transactionId: rec.id }, { 'retry-after': '5' })
    }
    if (rec.status === 'failed') throw new PaygateError('payment_failed', rec.error ?? 'the payment failed', { transactionId: rec.id })
    return rec
  }

  private used(a: StoredAuthorization): Promise<boolean> {
    if (!isEip3009(a)) throw new Error('no on-chain state')
    return this.authorizationUsed(a.from as `0x${string}`, a.nonce)
  }

  authorizationUsed(from: `0x${string}`, nonce: string): Promise<boolean> {
    return this.d.chain.authorizationUsed(from, nonce as `0x${string}`)
  }

  /** Close a transaction that was not paid: release (or keep) its reservation. */
  async finish(rec: TxRecord, change: Partial<TxRecord>, reservation: 'release' | 'keep'): Promise<void> {
    await this.withUsage(rec.agentId, async () => {
      const prev = rec
      const next: TxRecord = { ...prev, ...change, updatedAt: this.d.clock.now() }
      const ops = this.d.transactions.ops(next, prev)
      if (reservation === 'release') ops.push(this.d.policies.usageOp(rec.agentId, release(await this.d.policies.usageOf(rec.agentId), rec.id)))
      await this.d.store.batch(ops)
    })
  }

  /**
   * Commit the reservation, write the paid record and its ledger record in one batch, emit
   * events. `entry`: the ledger entry of `rec` when the caller built it already.
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
    let before = 0n
    let after = 0n
    const recording = await this.withUsage(rec.agentId, async () => {
      const usage = await this.d.policies.usageOf(rec.agentId)
      before = usedToday(usage, now)
      const committed = commit(usage, rec.id, now, policy.rateLimit?.calls ?? 0)
      after = usedToday(committed, now)
      const usageOp = this.d.policies.usageOp(rec.agentId, committed)
      const prev = rec
      const pending = this.d.outbox.record(
        entry ?? ledgerEntryOf(rec, plan.protocol),
        rec.id,
        (hash) => {
          const next: TxRecord = {
            ...prev,
            status: 'paid',
            txHash: hash,
            updatedAt: now,
            upstreamStatus: res.status,
            ...(settlement ? { settlement: { success: settlement.success, transaction: settlement.transaction, network: settlement.network, payer: settlement.payer, errorReason: settlement.errorReason } } : {}),
            ledger: { status: 'queued' },
          }
          return [...this.d.transactions.ops(next, prev), usageOp]
        },
      )
      // As for the reservation: written in order, awaited outside the agent's lock (wrapped,
      // so the lock's async function does not adopt the promise and wait for the write).
      return { written: outcome(pending) }
    })
    const recorded = await recording.written
    if (!recorded.ok) {
      this.d.policies.forgetUsage(rec.agentId)
      throw recorded.error
    }
    const txHash = recorded.value
    if (rec.authorization && isEip3009(rec.authorization)) this.balances.spend(rec.authorization.from, BigInt(rec.amount))
    const ts = new Date(now).toISOString()
    this.d.events.emit('payment.completed', { agentId: rec.agentId, timestamp: ts, transactionId: rec.id, protocol: plan.protocol, rail: plan.rail, amountUsdc: toUsdcNumber(BigInt(rec.amount)), endpoint: rec.endpoint, txHash })
    if (policy.dailyBudget !== undefined) {
      const budget = BigInt(policy.dailyBudget)
      const mark = (budget * BigInt(BUDGET_WARNING_PCT)) / 100n
      if (before < mark && after >= mark) {
        this.d.events.emit('budget.warning', {
          agentId: rec.agentId,
          timestamp: ts,
          threshold: BUDGET_WARNING_PCT,
          usedPct: Number((after * 10000n) / budget) / 100,
          usedUsdc: toUsdcNumber(after),
          dailyBudgetUsdc: toUsdcNumber(budget),
        })
      }
    }
    return { response: res, payment: { protocol: plan.protocol, rail: plan.rail, amount: BigInt(rec.amount), txHash, transactionId: rec.id, settlement } }
  }
}
