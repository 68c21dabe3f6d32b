import { isEip3009, type StoredAuthorization } from '../../ledger/transactions.js'
import type { Eip3009Authorization, HttpAnswer, Offer, PayableChain } from '../../protocols/types.js'
import { authorizationFor, authorizationJson, choose, detectX402, paymentHeaders, readSettlement, transferTypedData, typedData, typedDataDigest } from '../../protocols/x402.js'
import type { Upstream, UpstreamResponse } from '../../upstream/upstream.js'
import { extend } from '../../util/extend.js'
import { randomHex } from '../../util/random.js'
import type { AuthorizeInput, Delivery, Detected, PayRequest, Plan, ProtocolAdapter, SigningWallet } from './types.js'

/** The EIP-3009 nonce: 32 bytes from the pooled CSPRNG. */
export const newNonce = (): `0x${string}` => `0x${randomHex(32)}`

/** Rebuild the EIP-3009 message from its stored form. */
export function eip3009Of(a: StoredAuthorization): Eip3009Authorization {
  if (!isEip3009(a)) throw new Error('not an EIP-3009 authorization')
  return {
    from: a.from as `0x${string}`,
    to: a.to as `0x${string}`,
    value: BigInt(a.value),
    validAfter: BigInt(a.validAfter),
    validBefore: BigInt(a.validBefore),
    nonce: a.nonce as `0x${string}`,
  }
}

export function storedEip3009(auth: Eip3009Authorization, signature: `0x${string}`): StoredAuthorization {
  return { ...authorizationJson(auth), signature }
}

/** Sign `auth` in the configured chain's own token, over the domain the token reported at start (for offers that name none). */
export function signChainTransfer(wallet: SigningWallet, auth: Eip3009Authorization, chain: PayableChain): StoredAuthorization {
  const domain = { name: chain.tokenDomain.name, version: chain.tokenDomain.version, chainId: chain.chainId, verifyingContract: chain.token }
  return storedEip3009(auth, wallet.signDigest(typedDataDigest(transferTypedData(auth, domain))))
}

/** x402 (v1, v2 and the spec's shapes): pay by retrying the request with the payment headers. */
export class X402Adapter implements ProtocolAdapter {
  readonly protocol = 'x402' as const

  /**
   * One plan per offer: identical 402s read to the same offer objects (the readings are cached),
   * so a repeated 402 gives the same plan, which is how a signature made ahead is matched (AheadSigner).
   */
  private readonly plans = new WeakMap<Offer, { chain: string; plan: Plan }>()

  constructor(
    private readonly upstream: Upstream,
    /** pay.maxAuthorizationSeconds: a longer `maxTimeoutSeconds` is clamped to it (a target cannot hold a budget for ever). */
    private readonly maxValiditySeconds: number,
  ) {}

  detect(answer: HttpAnswer, req: PayRequest, chain: PayableChain): Detected {
    const detection = detectX402(answer)
    if (!detection.recognized) return { present: false }
    const offer = choose(detection.offers, chain, req.url)
    if (!offer) {
      // Not one entry reads as an x402 offer: the body claims x402 but matches none of its
      // schemas, which the spec answers with payment_protocol_error (as a malformed mpp/1.0 body).
      if (detection.offers.length === 0) return { present: true, plan: null, why: `no readable x402 offer (${detection.problems.map((p) => p.message).join('; ')})`, malformed: true }
      return { present: true, plan: null, why: 'no x402 offer on this chain and token for this origin', malformed: false }
    }
    const chainKey = `${chain.chainId}\u0000${chain.networkName}\u0000${chain.token}\u0000${chain.tokenDomain.name}\u0000${chain.tokenDomain.version}`
    let known = this.plans.get(offer)
    if (known?.chain !== chainKey) this.plans.set(offer, (known = { chain: chainKey, plan: this.plan(offer, chain) }))
    return { present: true, plan: known.plan }
  }

  private plan(offer: Offer, chain: PayableChain): Plan {
    const upstream = this.upstream
    const maxValiditySeconds = this.maxValiditySeconds
    const prepare = ({ wallet, nowMs }: AuthorizeInput): ReturnType<NonNullable<Plan['prepare']>> => {
      const auth = authorizationFor(offer, { from: wallet.address, nonce: newNonce(), nowSeconds: nowMs / 1000, maxValiditySeconds })
      return {
        unsigned: storedEip3009(auth, '' as `0x${string}`),
        sign: () => storedEip3009(auth, wallet.signDigest(typedDataDigest(typedData(offer, auth, chain.chainId, chain.tokenDomain)))),
      }
    }
    return {
      protocol: 'x402',
      rail: 'stablecoin',
      amount: offer.amount,
      offer: { shape: offer.shape, scheme: offer.scheme, network: offer.network, asset: offer.asset, payTo: offer.payTo, resource: offer.resource },
      fromWallet: true,
      signsLocally: true,
      prepare,
      async authorize(input: AuthorizeInput): Promise<StoredAuthorization> {
        return prepare(input).sign()
      },
      async deliver(req: PayRequest, stored: StoredAuthorization): Promise<Delivery> {
        if (!isEip3009(stored)) throw new Error('x402 pays with EIP-3009 only')
        const headers = paymentHeaders(offer, eip3009Of(stored), stored.signature as `0x${string}`)
        let res: UpstreamResponse
        try {
          res = await upstream.send({ url: req.url, method: req.method, headers: extend(req.headers, headers), body: req.body, timeoutMs: req.timeoutMs })
        } catch (e) {
          return { kind: 'transient', response: null, error: (e as Error).message }
        }
        if (res.status === 402) return { kind: 'refused', response: res, error: 'target answered 402' }
        if (res.status >= 500) return { kind: 'transient', response: res, error: `target answered ${res.status}` }
        return { kind: 'served', response: res }
      },
      settlement: readSettlement,
    }
  }
}
