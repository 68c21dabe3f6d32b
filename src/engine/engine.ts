import { randomBytes } from 'node:crypto'
import { Readable } from 'node:stream'
import type { Registry } from '../agents/registry.js'
import type { Chain } from '../chain/chain.js'
import { paygateUsdcAbi } from '../chain/contracts/abis.js'
import { ledgerLocation, recordIdOf, ZERO32 } from '../chain/ledger-tx.js'
import { PaygateError } from '../errors/index.js'
import type { EventBus } from '../events/bus.js'
import { endpointOf, newTxId, type StoredAuthorization, type Transactions, type TxRecord } from '../ledger/transactions.js'
import type { Outbox } from '../ledger/outbox.js'
import type { Logger } from '../log/index.js'
import { decide } from '../policy/decide.js'
import { domainOf } from '../policy/domains.js'
import type { PolicyStore } from '../policy/store.js'
import type { Store } from '../store/index.js'
import { commit, heldAmount, hold, release, usedToday } from '../policy/usage.js'
import type { Eip3009Authorization, HttpAnswer, Offer, PayableChain, Settlement } from '../protocols/types.js'
import { authorizationFor, choose, detectX402, paymentHeaders, readSettlement, sameOrigin, typedData, typedDataDigest } from '../protocols/x402.js'
import type { Clock } from '../util/clock.js'
import { formatUnits, toUsdcNumber } from '../util/money.js'
import { KeyedMutex } from '../util/mutex.js'
import type { Wallets } from '../wallet/wallets.js'
import { readBody, UpstreamError, type Upstream, type UpstreamResponse } from './upstream.js'

export interface PayRequest {
  agentId: string
  url: string
  method: string
  /** Lower-case names; hop-by-hop and Paygate's own headers already removed. */
  headers: Record<string, string>
  body: Buffer | null
  parentTxHash?: string
}

export interface PaymentInfo {
  protocol: 'x402' | 'mpp'
  amount: bigint
  txHash: string
  transactionId: string
  settlement: Settlement | null
}

/**
 * What the target answered, and the payment made for it, if any. `unpaid` explains a 402
 * Paygate could not pay (no known shape, nothing payable here): the proxy passes such an
 * answer through, `POST /v1/pay` turns it into an error.
 */
export interface PayOutcome {
  response: UpstreamResponse
  payment: PaymentInfo | null
  unpaid?: PaygateError
}

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
}

const MAX_402_BODY = 256 * 1024
const MAX_ATTEMPTS = 3
/** An authorization this close to expiry is not resent. */
const RESEND_MARGIN_S = 6n
const BUDGET_WARNING_PCT = 80

const answerStream = (a: HttpAnswer): UpstreamResponse => ({ status: a.status, headers: a.headers, body: Readable.from([a.body]) })

/**
 * The pay flow, shared by `POST /v1/pay` and the proxy: send → 402? → detect offers →
 * policy + reservation → sign → retry (same authorization on transient failures, after
 * checking the chain) → record (local record + ledger outbox in one batch) → events.
 */
export class PaymentEngine {
  private readonly usageLock = new KeyedMutex()
  /** Transactions whose outcome this process is still working on (the reconciler skips them). */
  readonly inFlight = new Set<string>()

  constructor(private readonly d: EngineDeps) {}

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

  get payable(): PayableChain {
    const { chainId, network, token } = this.d.chain.info
    return { chainId, networkName: network, token }
  }

  async pay(req: PayRequest): Promise<PayOutcome> {
    await this.d.registry.requireAgent(req.agentId)
    const parent = req.parentTxHash ? await this.parentOf(req.parentTxHash) : null
    const first = await this.send(req, {}).catch((e: unknown) => {
      throw e instanceof UpstreamError ? new PaygateError('upstream_unreachable', `the target could not be reached: ${e.message}`) : e
    })
    if (first.status !== 402) return { response: first, payment: null }

    const answer: HttpAnswer = { status: 402, headers: first.headers, body: await readBody(first.body, MAX_402_BODY) }
    const detection = detectX402(answer)
    if (!detection.recognized) {
      return { response: answerStream(answer), payment: null, unpaid: new PaygateError('payment_protocol_error', 'the target answered 402 without a payment requirement in any known shape') }
    }
    const offer = choose(detection.offers, this.payable, req.url)
    if (!offer) {
      const why = detection.offers.length === 0 ? `no readable offer (${detection.problems.map((p) => p.message).join('; ')})` : 'no offer on this chain and token for this origin'
      return { response: answerStream(answer), payment: null, unpaid: new PaygateError('no_payable_offer', `the target's 402 has ${why}`) }
    }
    if (!sameOrigin(offer, req.url)) throw new PaygateError('no_payable_offer', 'the offer names a resource on another origin')
    return this.payOffer(req, offer, parent)
  }

  private async parentOf(hash: string): Promise<TxRecord> {
    const p = await this.d.transactions.find(hash)
    if (!p || !p.txHash) throw new PaygateError('invalid_request', `parentTxHash ${hash} is not a known transaction`, { field: 'parentTxHash' })
    return p
  }

  private send(req: PayRequest, extra: Record<string, string>, timeoutMs?: number): Promise<UpstreamResponse> {
    return this.d.upstream.send({ url: req.url, method: req.method, headers: { ...req.headers, ...extra }, body: req.body, ...(timeoutMs ? { timeoutMs } : {}) })
  }

  private async payOffer(req: PayRequest, offer: Offer, parent: TxRecord | null): Promise<PayOutcome> {
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
      protocol: offer.protocol,
      amount: offer.amount.toString(),
      txHash: null,
      parentTxHash: parent?.txHash ?? null,
      depth: parent ? parent.depth + 1 : 0,
      offer: { shape: offer.shape, scheme: offer.scheme, network: offer.network, asset: offer.asset, payTo: offer.payTo, resource: offer.resource },
    }
    const wallet = await this.d.wallets.require(agentId)
    const signer = await this.d.wallets.signer(agentId)

    // Policy, funds, signature and reservation, atomically per agent: one batch writes the
    // hold and the record with its signed authorization before anything leaves.
    const reserved = await this.withUsage(agentId, async () => {
      const [policy, usage] = await Promise.all([this.d.policies.policyOf(agentId), this.d.policies.usageOf(agentId)])
      const decision = decide(policy, usage, { host: domainOf(req.url), amount: offer.amount }, now)
      if (!decision.ok) {
        await this.d.transactions.put({ ...base, status: 'rejected', reason: decision.reason, detail: decision.detail })
        return { kind: 'rejected' as const, reason: decision.reason, detail: decision.detail }
      }
      // Funds: the on-chain balance less what other in-flight payments have reserved.
      const balance = await this.d.chain.balanceOf(wallet.address)
      const available = balance - heldAmount(usage)
      if (available < offer.amount) {
        await this.d.transactions.put({ ...base, status: 'failed', error: 'insufficient_funds' })
        return { kind: 'funds' as const, balance, available }
      }
      const auth = authorizationFor(offer, { from: wallet.address, nonce: `0x${randomBytes(32).toString('hex')}`, nowSeconds: this.d.clock.now() / 1000 })
      const signature = signer.signDigest65(typedDataDigest(typedData(offer, auth, this.d.chain.info.chainId, { name: 'USD Coin', version: '2' })))
      const authorization: StoredAuthorization = {
        from: auth.from,
        to: auth.to,
        value: auth.value.toString(),
        validAfter: auth.validAfter.toString(),
        validBefore: auth.validBefore.toString(),
        nonce: auth.nonce,
        signature,
      }
      const rec: TxRecord = { ...base, authorization }
      await this.d.store.batch([this.d.policies.usageOp(agentId, hold(usage, { id: base.id, amount: base.amount, at: now })), ...this.d.transactions.ops(rec)])
      return { kind: 'reserved' as const, rec, auth, signature }
    })
    if (reserved.kind === 'rejected') {
      this.d.events.emit('policy.violation', { agentId, timestamp: new Date(now).toISOString(), reason: reserved.reason, detail: reserved.detail, endpoint: base.endpoint, transactionId: base.id })
      throw new PaygateError('policy_violation', reserved.detail, { reason: reserved.reason })
    }
    if (reserved.kind === 'funds') {
      const { balance, available } = reserved
      throw new PaygateError('insufficient_funds', `wallet holds ${formatUnits(balance)} USDC with ${formatUnits(balance - available)} reserved; ${formatUnits(offer.amount)} needed`, {
        required: { usdc: toUsdcNumber(offer.amount) },
        available: { usdc: toUsdcNumber(available > 0n ? available : 0n) },
      })
    }
    this.inFlight.add(base.id)
    try {
      return await this.send402Paid(req, offer, reserved.rec, reserved.auth, reserved.signature)
    } finally {
      this.inFlight.delete(base.id)
    }
  }

  /** Retry the request with the payment; the same authorization on transient failures, never a second one. */
  private async send402Paid(req: PayRequest, offer: Offer, signed: TxRecord, auth: Eip3009Authorization, signature: `0x${string}`): Promise<PayOutcome> {
    let rec = signed
    const headers = paymentHeaders(offer, auth, signature)

    let last: { response: UpstreamResponse | null; error: string } = { response: null, error: '' }
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      rec = { ...rec, attempts: attempt }
      let res: UpstreamResponse | null = null
      try {
        res = await this.send(req, headers)
      } catch (e) {
        last = { response: null, error: (e as Error).message }
      }
      if (res && res.status < 500 && res.status !== 402) {
        // Served: the target took the payment.
        return this.paid(rec, res, offer)
      }
      // 402 again, 5xx or no answer: the chain says whether the money moved.
      const used = await this.authorizationUsed(auth.from, auth.nonce).catch(() => null)
      if (used === true) {
        if (res) return this.paid(rec, res, offer)
        const answer: UpstreamResponse = { status: 502, headers: { 'content-type': 'application/json' }, body: Readable.from([Buffer.from('{"error":"upstream_answer_lost"}')]) }
        return this.paid(rec, answer, offer)
      }
      if (res) {
        const body = await readBody(res.body, MAX_402_BODY).catch(() => Buffer.alloc(0))
        last = { response: { status: res.status, headers: res.headers, body: Readable.from([body]) }, error: `target answered ${res.status}: ${body.toString('utf8', 0, 200)}` }
        if (res.status === 402 && used === false) break // refused outright: resending the same proof will not help
      }
      const nowS = BigInt(Math.floor(this.d.clock.now() / 1000))
      if (used === false && auth.validBefore - nowS <= RESEND_MARGIN_S) break
    }
    // Not paid as far as we know. If the chain could not tell us, keep the reservation for the reconciler.
    const used = await this.authorizationUsed(auth.from, auth.nonce).catch(() => null)
    if (used === true) return this.paid(rec, last.response ?? { status: 502, headers: {}, body: Readable.from([Buffer.alloc(0)]) }, offer)
    if (used === null) await this.finish(rec, { status: 'unknown', error: last.error }, 'keep')
    else await this.finish(rec, { status: 'failed', error: last.error, ...(last.response ? { upstreamStatus: last.response.status } : {}) }, 'release')
    this.d.events.emit('payment.failed', { agentId: rec.agentId, timestamp: new Date().toISOString(), transactionId: rec.id, error: last.error, endpoint: rec.endpoint })
    throw new PaygateError('payment_failed', `payment not completed after ${rec.attempts ?? MAX_ATTEMPTS} attempts: ${last.error}`, { transactionId: rec.id })
  }

  async authorizationUsed(from: `0x${string}`, nonce: string): Promise<boolean> {
    return this.d.chain.publicClient.readContract({
      address: this.d.chain.info.token,
      abi: paygateUsdcAbi,
      functionName: 'authorizationState',
      args: [from, nonce as `0x${string}`],
    })
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

  /** Commit the reservation, write the paid record and its ledger record in one batch, emit events. */
  async paid(rec: TxRecord, res: UpstreamResponse, offer: Pick<Offer, 'protocol'>): Promise<PayOutcome> {
    const settlement = readSettlement(res.headers)
    const now = this.d.clock.now()
    const policy = await this.d.policies.policyOf(rec.agentId)
    const { origin, pathHash } = ledgerLocation(rec.endpoint)
    let before = 0n
    let after = 0n
    const txHash = await this.withUsage(rec.agentId, async () => {
      const usage = await this.d.policies.usageOf(rec.agentId)
      before = usedToday(usage, now)
      const committed = commit(usage, rec.id, now, policy.rateLimit?.calls ?? 0)
      after = usedToday(committed, now)
      const prev = rec
      return this.d.outbox.record(
        {
          id: recordIdOf(rec.id),
          parentTxHash: (rec.parentTxHash as `0x${string}` | null) ?? ZERO32,
          agentId: rec.agentId,
          amount: BigInt(rec.amount),
          protocol: offer.protocol,
          origin,
          pathHash,
          depth: rec.depth,
        },
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
          return [...this.d.transactions.ops(next, prev), this.d.policies.usageOp(rec.agentId, committed)]
        },
      )
    })
    const ts = new Date(now).toISOString()
    this.d.events.emit('payment.completed', { agentId: rec.agentId, timestamp: ts, transactionId: rec.id, protocol: offer.protocol, amountUsdc: toUsdcNumber(BigInt(rec.amount)), endpoint: rec.endpoint, txHash })
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
    return { response: res, payment: { protocol: offer.protocol, amount: BigInt(rec.amount), txHash, transactionId: rec.id, settlement } }
  }
}
