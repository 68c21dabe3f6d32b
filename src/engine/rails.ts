import { PaygateError } from '../errors/index.js'
import type { RailName } from '../protocols/mpp.js'
import { postJson } from '../upstream/post.js'

/** What a rail is asked to authorize: one MPP payment, in the merchant's terms and in USDC base units. */
export interface RailCharge {
  /** Paygate's transaction id: the rail's idempotency key (asking twice must not charge twice). */
  txId: string
  agentId: string
  /** The method identifier as offered (e.g. `stripe`, `card`, `lightning`). */
  method: string
  /** The offer's amount exactly as offered, and its value in USDC base units. */
  value: string
  currency: string
  amount: bigint
  /** The service being paid (origin) and the resource URL. */
  merchant: string
  resource: string
}

/** A rail's proof of payment: sent as the `authorization` object of the MPP payment POST. */
export interface RailAuthorization {
  authorization: Record<string, unknown>
  /** Unix ms after which the merchant can no longer redeem it (default: 10 minutes). */
  expiresAt?: number
}

/**
 * A payment rail other than the built-in stablecoin one (card, Lightning, custom). It is
 * called after the amount is reserved against the agent's budget, outside the agent's
 * lock; it must be idempotent per `txId`.
 */
export interface Rail {
  readonly name: RailName
  authorize(charge: RailCharge): Promise<RailAuthorization>
}

/** A card issuer/processor: returns a single-use token for one charge. */
export interface CardProvider {
  readonly name: string
  createToken(charge: RailCharge): Promise<{ token: string; expiresAt?: number }>
}

/** The card rail: the provider's token travels as `{type: "card", provider, token}`. */
export class CardRail implements Rail {
  readonly name = 'card'
  constructor(private readonly provider: CardProvider) {}

  async authorize(charge: RailCharge): Promise<RailAuthorization> {
    const { token, expiresAt } = await this.provider.createToken(charge)
    return { authorization: { type: 'card', provider: this.provider.name, token }, ...(expiresAt !== undefined ? { expiresAt } : {}) }
  }
}

/**
 * A card provider reached over HTTP (`mpp.cardProviderUrl`): POST JSON `{idempotencyKey,
 * agentId, method, amount: {value, currency}, amountUsdcUnits, merchant, resource}` with
 * `Authorization: Bearer <mpp.cardProviderKey>` when set; expects 2xx `{token, expiresAt?}`
 * (`expiresAt` in Unix ms). Any other answer fails the payment before anything is sent
 * to the merchant.
 */
export class HttpCardProvider implements CardProvider {
  readonly name: string

  constructor(
    private readonly url: string,
    private readonly key: string | null,
    private readonly timeoutMs = 10_000,
  ) {
    this.name = new URL(url).host
  }

  async createToken(charge: RailCharge): Promise<{ token: string; expiresAt?: number }> {
    const body = JSON.stringify({
      idempotencyKey: charge.txId,
      agentId: charge.agentId,
      method: charge.method,
      amount: { value: charge.value, currency: charge.currency },
      amountUsdcUnits: charge.amount.toString(),
      merchant: charge.merchant,
      resource: charge.resource,
    })
    const headers = { 'content-type': 'application/json', 'idempotency-key': charge.txId, ...(this.key ? { authorization: `Bearer ${this.key}` } : {}) }
    let answer: { status: number; json: unknown }
    try {
      answer = await postJson(this.url, headers, body, this.timeoutMs)
    } catch (e) {
      throw new PaygateError('payment_failed', `the card provider could not be reached: ${(e as Error).message}`)
    }
    const { status, json } = answer
    const token = (json as { token?: unknown } | null)?.token
    if (status < 200 || status > 299 || typeof token !== 'string' || token === '') {
      throw new PaygateError('payment_failed', `the card provider refused the charge (HTTP ${status})`)
    }
    const exp = (json as { expiresAt?: unknown }).expiresAt
    return { token, ...(typeof exp === 'number' && Number.isFinite(exp) ? { expiresAt: exp } : {}) }
  }
}
