import { Readable } from 'node:stream'
import { hashTypedData } from 'viem'
import { isEip3009, type StoredAuthorization } from '../../ledger/transactions.js'
import {
  chooseRail,
  detectMpp,
  eip3009Authorization,
  intentAuthorization,
  paymentBody,
  paymentIntentTypedData,
  SESSION_HEADER,
  sessionExpiry,
  sessionToken,
  type MppAuthorization,
  type MppOffer,
  type RailChoice,
  type RailName,
} from '../../protocols/mpp.js'
import type { HttpAnswer, PayableChain } from '../../protocols/types.js'
import { readSettlement } from '../../protocols/x402.js'
import type { Clock } from '../../util/clock.js'
import type { Rail } from '../rails.js'
import type { MppSession, MppSessions } from '../sessions.js'
import type { Upstream, UpstreamResponse } from '../../upstream/upstream.js'
import type { AuthorizeInput, Delivery, Detected, PayRequest, Plan, ProtocolAdapter } from './types.js'
import { eip3009Of, newNonce, signChainTransfer } from './x402.js'

/** Default lifetime of a rail's proof when the rail names none. */
const RAIL_PROOF_MS = 10 * 60_000

export interface MppSettings {
  /** Method identifier → rail (merged over the built-in map). */
  methods: Readonly<Record<string, RailName>>
  /** USDC per unit of another currency, as decimal strings. */
  rates: Readonly<Record<string, string>>
  /** Hosts whose payment endpoints may be used for any target (besides the target's own origin). */
  paymentEndpointHosts: readonly string[]
  /** Session lifetime when neither the answer nor the offer names one. */
  sessionTtlSeconds: number
  /** Validity of a stablecoin authorization (pay.maxAuthorizationSeconds). */
  maxAuthorizationSeconds: number
}

const originOf = (url: string): string => new URL(url).origin

/**
 * MPP in the spec's mpp/1.0 shape: pay by POSTing `{method, amount, authorization}` to the
 * payment endpoint; the answer carries the resource and a session token that later calls
 * send instead of paying.
 */
export class MppAdapter implements ProtocolAdapter {
  readonly protocol = 'mpp' as const
  private readonly available: ReadonlySet<RailName>

  constructor(
    private readonly upstream: Upstream,
    readonly sessions: MppSessions,
    private readonly rails: ReadonlyMap<RailName, Rail>,
    private readonly settings: MppSettings,
    private readonly clock: Clock,
  ) {
    this.available = new Set(rails.keys())
  }

  detect(answer: HttpAnswer, req: PayRequest, chain: PayableChain): Detected {
    const d = detectMpp(answer, req.url, this.settings.rates)
    if (!d.present) return { present: false }
    if (!d.offer) return { present: true, plan: null, why: `malformed mpp/1.0 offer: ${d.problem}`, malformed: true }
    const offer = d.offer
    const endpoint = new URL(offer.paymentEndpoint)
    if (endpoint.origin !== originOf(req.url) && !this.settings.paymentEndpointHosts.includes(endpoint.hostname.toLowerCase())) {
      return { present: true, plan: null, why: `the mpp/1.0 paymentEndpoint ${endpoint.origin} is on another origin (allow its host in mpp.paymentEndpointHosts)`, malformed: false }
    }
    // Only a session carries another method's request (and its body) to the target after paying:
    // without one the payment endpoint's answer would stand in for a request never made.
    if (!offer.sessionSupported && req.method !== 'GET' && req.method !== 'HEAD') {
      return { present: true, plan: null, why: `the mpp/1.0 offer sells no session, so a ${req.method} would be paid without reaching the target`, malformed: false }
    }
    const { choice, why } = chooseRail(offer, this.settings.methods, this.available, chain)
    if (!choice) return { present: true, plan: null, why: `no payable mpp/1.0 method: ${why}`, malformed: false }
    return { present: true, plan: this.plan(offer, choice, chain) }
  }

  /** As `session` from memory alone; undefined when that would need a store read. */
  cachedSession(agentId: string, url: string, origin = originOf(url)): MppSession | null | undefined {
    return this.sessions.cachedValid(agentId, origin)
  }

  /** The agent's valid session with the service at `url`, if any. */
  session(agentId: string, url: string, origin = originOf(url)): Promise<MppSession | null> {
    return this.sessions.valid(agentId, origin)
  }

  dropSession(agentId: string, url: string, token: string): Promise<void> {
    return this.sessions.drop(agentId, originOf(url), token)
  }

  private plan(offer: MppOffer, choice: RailChoice, chain: PayableChain): Plan {
    const stable = choice.rail === 'stablecoin'
    const rail = this.rails.get(choice.rail)
    const clock = this.clock
    return {
      protocol: 'mpp',
      rail: choice.rail,
      paymentMethod: choice.method,
      amount: offer.amount,
      offer: {
        shape: offer.shape,
        scheme: choice.rail,
        network: stable ? (offer.network ?? `eip155:${chain.chainId}`) : offer.currency,
        asset: stable ? chain.token : offer.currency,
        payTo: offer.payTo ?? '',
        resource: offer.paymentEndpoint,
      },
      fromWallet: stable,
      signsLocally: stable,
      sellsSession: offer.sessionSupported,
      paidWhenServed: true,
      authorize: async ({ req, wallet, nowMs, txId }: AuthorizeInput): Promise<StoredAuthorization> => {
        const expiry = BigInt(Math.floor(nowMs / 1000) + this.settings.maxAuthorizationSeconds)
        if (stable && offer.payTo) {
          const auth = { from: wallet.address, to: offer.payTo, value: offer.amount, validAfter: 0n, validBefore: expiry, nonce: newNonce() }
          return signChainTransfer(wallet, auth, chain)
        }
        if (stable) {
          const intent = { payer: wallet.address, amount: offer.amount, currency: offer.currency.toUpperCase(), resource: req.url, nonce: newNonce(), expiry }
          const signature = wallet.signDigest(hashTypedData(paymentIntentTypedData(intent, chain.chainId)))
          return { kind: 'intent', expiresAt: Number(expiry) * 1000, wire: intentAuthorization(intent, signature, chain.chainId) }
        }
        if (!rail) throw new Error(`no rail ${choice.rail}`)
        const proof = await rail.authorize({
          txId,
          agentId: req.agentId,
          method: choice.method,
          value: offer.value,
          currency: offer.currency,
          amount: offer.amount,
          merchant: originOf(req.url),
          resource: req.url,
        })
        return { kind: choice.rail === 'card' ? 'card' : 'rail', expiresAt: proof.expiresAt ?? clock.now() + RAIL_PROOF_MS, wire: proof.authorization }
      },
      deliver: (req: PayRequest, auth: StoredAuthorization, txId: string): Promise<Delivery> => this.deliver(req, offer, choice, chain, auth, txId),
      settlement: readSettlement,
    }
  }

  private async deliver(req: PayRequest, offer: MppOffer, choice: RailChoice, chain: PayableChain, auth: StoredAuthorization, txId: string): Promise<Delivery> {
    const wire: MppAuthorization = isEip3009(auth) ? eip3009Authorization(eip3009Of(auth), auth.signature as `0x${string}`, chain) : (auth.wire as MppAuthorization)
    let res: UpstreamResponse
    try {
      res = await this.upstream.send({
        url: offer.paymentEndpoint,
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: req.headers.accept ?? '*/*' },
        body: paymentBody(offer, choice.method, wire, req.url),
      })
    } catch (e) {
      return { kind: 'transient', response: null, error: `payment endpoint: ${(e as Error).message}` }
    }
    if (res.status >= 500) return { kind: 'transient', response: res, error: `payment endpoint answered ${res.status}` }
    if (res.status < 200 || res.status > 299) return { kind: 'refused', response: res, error: `payment endpoint answered ${res.status}` }

    const token = sessionToken(res.headers)
    if (token) {
      const now = this.clock.now()
      await this.sessions.save(req.agentId, originOf(req.url), { token, expiresAt: sessionExpiry(res.headers, offer, now, this.settings.sessionTtlSeconds), createdAt: now, transactionId: txId })
    }
    // GET and HEAD: the payment answer is the resource. Other methods replay the request under the session, so its body reaches the target.
    if (req.method === 'GET' || req.method === 'HEAD' || !token) return { kind: 'served', response: res }
    res.body.resume()
    try {
      return {
        kind: 'served',
        response: await this.upstream.send({ url: req.url, method: req.method, headers: { ...req.headers, [SESSION_HEADER]: token }, body: req.body, timeoutMs: req.timeoutMs }),
      }
    } catch (e) {
      // Paid: the session was bought; only the replay's answer is lost.
      const lost = Buffer.from(JSON.stringify({ error: 'upstream_answer_lost', detail: (e as Error).message }))
      return { kind: 'served', response: { status: 502, headers: { 'content-type': 'application/json' }, body: Readable.from([lost]) } }
    }
  }
}
