import { Readable } from 'node:stream'
import { isEip3009, type StoredAuthorization } from '../../ledger/transactions.js'
import { acceptPayment, challengeNonce, credentialHeader, detectPaymentAuth, evmAuthorization, evmPayload, problemCode, readReceipt, type AuthOffer } from '../../protocols/payment-auth.js'
import type { HttpAnswer, PayableChain } from '../../protocols/types.js'
import type { Clock } from '../../util/clock.js'
import type { Rail } from '../rails.js'
import { readBody, type Upstream, type UpstreamResponse } from '../../upstream/upstream.js'
import type { AuthorizeInput, Delivery, Detected, PayRequest, Plan, ProtocolAdapter } from './types.js'
import { eip3009Of, signChainTransfer } from './x402.js'

const MAX_PROBLEM_BYTES = 64 * 1024

const isProblem = (headers: UpstreamResponse['headers']): boolean =>
  String(headers['content-type'] ?? '')
    .toLowerCase()
    .includes('problem+json')
const CARD_PROOF_MS = 10 * 60_000

/**
 * MPP over the HTTP "Payment" authentication scheme: `evm/charge` from the agent's wallet
 * (EIP-3009), `stripe/charge` through the card rail. Same rails, records and preference
 * as the mpp/1.0 shape (protocol `mpp`).
 */
export class PaymentAuthAdapter implements ProtocolAdapter {
  readonly protocol = 'mpp' as const
  /** Sent on every first request: what Paygate can pay. */
  readonly acceptPayment: string

  constructor(
    private readonly upstream: Upstream,
    private readonly card: Rail | null,
    private readonly rates: Readonly<Record<string, string>>,
    private readonly clock: Clock,
    /** pay.maxAuthorizationSeconds: a challenge that expires later is signed for this long only. */
    private readonly maxValiditySeconds: number,
  ) {
    this.acceptPayment = acceptPayment(card !== null)
  }

  detect(answer: HttpAnswer, _req: PayRequest, chain: PayableChain): Detected {
    const d = detectPaymentAuth(answer, chain, { nowMs: this.clock.now(), canCard: this.card !== null, rates: this.rates })
    if (!d.present) return { present: false }
    // The stablecoin rail first (the cheapest evm offer), the card rail only without one.
    const evm = d.offers.filter((o) => o.kind === 'evm').sort((a, b) => (a.amount < b.amount ? -1 : a.amount > b.amount ? 1 : 0))[0]
    const offer = evm ?? d.offers.find((o) => o.kind === 'stripe')
    if (!offer) {
      return { present: true, plan: null, why: `no payable Payment challenge (${d.skipped.join('; ') || 'none readable'})`, malformed: false, ...(d.expired > 0 ? { expired: true } : {}) }
    }
    return { present: true, plan: this.plan(offer, chain) }
  }

  private plan(offer: AuthOffer, chain: PayableChain): Plan {
    const c = offer.challenge
    const method = `${c.method}/${c.intent}`
    const network = `eip155:${chain.chainId}`
    const card = this.card
    const clock = this.clock
    const maxValiditySeconds = this.maxValiditySeconds
    const stable = offer.kind === 'evm'
    return {
      protocol: 'mpp',
      rail: stable ? 'stablecoin' : 'card',
      paymentMethod: method,
      amount: offer.amount,
      offer: {
        shape: 'payment-auth',
        scheme: method,
        network: stable ? network : offer.currency,
        asset: stable ? chain.token : offer.currency,
        payTo: stable ? offer.recipient : '',
        resource: null,
      },
      fromWallet: stable,
      signsLocally: stable,
      ...(offer.kind === 'evm' ? { fixedNonce: challengeNonce(c) } : {}),
      async authorize({ req, wallet, nowMs, txId }: AuthorizeInput): Promise<StoredAuthorization> {
        if (offer.kind === 'evm') {
          const auth = evmAuthorization(offer, wallet.address, nowMs, maxValiditySeconds)
          return signChainTransfer(wallet, auth, chain)
        }
        if (!card) throw new Error('no card rail')
        const proof = await card.authorize({
          txId,
          agentId: req.agentId,
          method,
          value: offer.value,
          currency: offer.currency,
          amount: offer.amount,
          merchant: new URL(req.url).origin,
          resource: req.url,
        })
        const token = proof.authorization.token
        if (typeof token !== 'string') throw new Error('the card rail returned no token')
        return { kind: 'card', expiresAt: Math.min(proof.expiresAt ?? Infinity, offer.expiresAt ?? Infinity, clock.now() + CARD_PROOF_MS), wire: { spt: token } }
      },
      deliver: async (req: PayRequest, auth: StoredAuthorization): Promise<Delivery> => {
        const [name, value] = isEip3009(auth)
          ? credentialHeader(c, evmPayload(eip3009Of(auth), auth.signature as `0x${string}`), `did:pkh:${network}:${auth.from}`)
          : credentialHeader(c, auth.wire as Record<string, unknown>)
        let res: UpstreamResponse
        try {
          // The agent's own Accept-Payment (kept in req.headers) wins over Paygate's list.
          res = await this.upstream.send({
            url: req.url,
            method: req.method,
            headers: { 'accept-payment': this.acceptPayment, ...req.headers, [name]: value },
            body: req.body,
            timeoutMs: req.timeoutMs,
          })
        } catch (e) {
          return { kind: 'transient', response: null, error: (e as Error).message }
        }
        if (res.status >= 500) return { kind: 'transient', response: res, error: `target answered ${res.status}` }
        // A refusal is a 402, or another 4xx carrying a paymentauth.org problem (mppx answers
        // method-unsupported and bad-request with 400).
        if (res.status !== 402 && !(res.status >= 400 && isProblem(res.headers))) return { kind: 'served', response: res }
        const body = await readBody(res.body, MAX_PROBLEM_BYTES).catch(() => Buffer.alloc(0))
        const problem = problemCode(body)
        const replay = { ...res, body: Readable.from([body]) }
        if (res.status !== 402 && !problem) return { kind: 'served', response: replay }
        return { kind: 'refused', response: replay, error: problem ? `target refused the credential (${problem.type})` : 'target answered 402', ...(problem ? { code: problem.code } : {}) }
      },
      settlement: (headers) => readReceipt(headers, stable ? network : null),
    }
  }
}
