/**
 * MPP, the spec's `mpp/1.0` JSON shape, pure: read the 402 body, turn its decimal amount
 * into USDC base units, map the offered method identifiers to rails, and build what is
 * POSTed to the payment endpoint. No sockets, no storage, no keys.
 *
 * 402 body: `{protocol: "mpp/1.0", amount: {value, currency}, paymentMethods: [...],
 * sessionSupported, paymentEndpoint}` plus the optional extensions Paygate reads:
 * `payTo` (recipient address: the stablecoin rail then pays by EIP-3009 to it),
 * `network` (must name the configured chain when present), `token` (must be the chain's
 * token when present), `sessionTtlSeconds` (session lifetime).
 *
 * Payment: POST `{method, amount: {value, currency}, authorization, resource}` to
 * `paymentEndpoint` (`method` and `amount` echoed exactly as offered; `resource` is an
 * extension naming the URL being bought). The answer carries the resource and
 * `X-MPP-Session` (lifetime in `X-MPP-Session-Expires`: seconds, or an HTTP/ISO date).
 */
import { getAddress, isAddress } from 'viem'
import { PaygateError } from '../errors/index.js'
import type { Address, Eip3009Authorization, Hex, HttpAnswer, PayableChain } from './types.js'
import { authorizationJson, namesChain } from './x402.js'

export const MPP_VERSION = 'mpp/1.0'
export const SESSION_HEADER = 'x-mpp-session'
export const SESSION_EXPIRES_HEADER = 'x-mpp-session-expires'

/** Built-in rails; more plug in by name through the rail interface. */
export type RailName = 'stablecoin' | 'card' | (string & {})

/** Method identifier → rail. Literal `stablecoin` and `card`, plus vendor names. */
export const DEFAULT_METHOD_RAILS: Readonly<Record<string, RailName>> = Object.freeze({
  stablecoin: 'stablecoin',
  card: 'card',
  usdc: 'stablecoin',
  tempo: 'stablecoin',
  stripe: 'card',
  lightning: 'lightning',
})

export interface MppOffer {
  protocol: 'mpp'
  shape: 'mpp/1.0'
  /** `amount.value` and `amount.currency` exactly as offered (echoed back when paying). */
  value: string
  currency: string
  /** USDC base units the offer costs (what policy and budget see). */
  amount: bigint
  /** Literal method identifiers as offered, in order. */
  methods: string[]
  sessionSupported: boolean
  /** Absolute URL (a relative one is resolved against the request). */
  paymentEndpoint: string
  payTo: Address | null
  network: string | null
  token: Address | null
  sessionTtlSeconds: number | null
  raw: unknown
}

/** What a 402 says in the mpp/1.0 shape: absent, broken (why), or one offer. */
export type MppDetection = { present: false } | { present: true; offer: MppOffer } | { present: true; offer: null; problem: string }

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v)

const fail = (message: string): never => {
  throw new PaygateError('payment_protocol_error', message)
}

const DECIMAL_RE = /^(\d+)(?:\.(\d+))?$/

/** A non-negative decimal string as `units / 10^scale`. */
function splitDecimal(s: string, field: string): { units: bigint; scale: number } {
  const m = DECIMAL_RE.exec(s)
  if (!m) return fail(`${field} must be a non-negative decimal string, got ${JSON.stringify(s)}`)
  const frac = m[2] ?? ''
  if (m[1]!.length + frac.length > 78) return fail(`${field} is out of range`)
  return { units: BigInt(m[1]! + frac), scale: frac.length }
}

/**
 * USDC base units (6 decimals) for `value` in `currency`. USD and USDC are 1:1 and must
 * fit 6 decimals exactly. Another currency (or a finer USD/USDC amount) needs a rate in
 * `rates` (USDC per unit of the currency, a decimal string); the converted amount is
 * rounded up to the next base unit, so the merchant is never paid short.
 */
export function toBaseUnits(value: string, currency: string, rates: Readonly<Record<string, string>> = {}): bigint {
  const v = splitDecimal(value, 'amount.value')
  const cur = currency.trim().toUpperCase()
  const rate = rates[cur]
  if (rate !== undefined) {
    const r = splitDecimal(rate, `rate for ${cur}`)
    const num = v.units * r.units * 10n ** 6n
    const den = 10n ** BigInt(v.scale + r.scale)
    return (num + den - 1n) / den
  }
  if (cur !== 'USD' && cur !== 'USDC') return fail(`currency ${JSON.stringify(currency)} is not supported (USD or USDC, or configure a rate in mpp.rates)`)
  if (v.scale > 6) {
    const extra = v.scale - 6
    if (v.units % 10n ** BigInt(extra) !== 0n) return fail(`amount.value ${value} has more than 6 decimal places`)
    return v.units / 10n ** BigInt(extra)
  }
  return v.units * 10n ** BigInt(6 - v.scale)
}

function readAddress(v: unknown, field: string): Address | null {
  if (v === undefined || v === null) return null
  if (typeof v !== 'string' || !isAddress(v, { strict: false })) return fail(`${field} must be a 0x-prefixed 20-byte address`)
  return getAddress(v)
}

/**
 * Read an mpp/1.0 402 body. A body whose `protocol` is not `mpp/…` is not this shape;
 * one that claims it but is malformed (or names an unsupported currency) is reported as
 * a problem, never thrown.
 */
export function detectMpp(answer: HttpAnswer, requestUrl: string, rates: Readonly<Record<string, string>> = {}): MppDetection {
  const text = answer.body
    .toString('utf8')
    .replace(/^\uFEFF/, '')
    .trim()
  if (!text.startsWith('{') || !text.includes('mpp/')) return { present: false }
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    return { present: false }
  }
  if (!isObject(json) || typeof json.protocol !== 'string' || !json.protocol.toLowerCase().startsWith('mpp/')) return { present: false }
  try {
    return { present: true, offer: readOffer(json, requestUrl, rates) }
  } catch (e) {
    return { present: true, offer: null, problem: e instanceof PaygateError ? e.detail : String(e) }
  }
}

function readOffer(b: Record<string, unknown>, requestUrl: string, rates: Readonly<Record<string, string>>): MppOffer {
  if (b.protocol !== MPP_VERSION) fail(`protocol ${JSON.stringify(b.protocol)} is not supported (only ${MPP_VERSION})`)
  const amount = b.amount
  if (!isObject(amount)) return fail('amount must be an object {value, currency}')
  if (typeof amount.value !== 'string') return fail('amount.value must be a decimal string')
  if (typeof amount.currency !== 'string' || !/^[A-Za-z0-9._-]{1,16}$/.test(amount.currency)) return fail('amount.currency must be a currency code')
  const methods = b.paymentMethods
  if (!Array.isArray(methods) || methods.length === 0 || !methods.every((m) => typeof m === 'string' && m.length > 0 && m.length <= 100)) {
    return fail('paymentMethods must be a non-empty array of method identifiers')
  }
  if (typeof b.sessionSupported !== 'boolean') return fail('sessionSupported must be a boolean')
  if (typeof b.paymentEndpoint !== 'string' || b.paymentEndpoint === '') return fail('paymentEndpoint must be a URL')
  let endpoint: URL
  try {
    endpoint = new URL(b.paymentEndpoint, requestUrl)
  } catch {
    return fail('paymentEndpoint must be a URL')
  }
  if (endpoint.protocol !== 'http:' && endpoint.protocol !== 'https:') fail('paymentEndpoint must be an http(s) URL')
  let ttl: number | null = null
  if (b.sessionTtlSeconds !== undefined && b.sessionTtlSeconds !== null) {
    if (typeof b.sessionTtlSeconds !== 'number' || !Number.isSafeInteger(b.sessionTtlSeconds) || b.sessionTtlSeconds < 1) fail('sessionTtlSeconds must be a positive integer')
    ttl = b.sessionTtlSeconds as number
  }
  if (b.network !== undefined && b.network !== null && typeof b.network !== 'string') fail('network must be a string')
  return {
    protocol: 'mpp',
    shape: 'mpp/1.0',
    value: amount.value,
    currency: amount.currency,
    amount: toBaseUnits(amount.value, amount.currency, rates),
    methods: methods as string[],
    sessionSupported: b.sessionSupported,
    paymentEndpoint: endpoint.toString(),
    payTo: readAddress(b.payTo, 'payTo'),
    network: (b.network as string | undefined) ?? null,
    token: readAddress(b.token, 'token'),
    sessionTtlSeconds: ttl,
    raw: b,
  }
}

/** The rail of a method identifier (case-insensitive; a vendor prefix such as `tempo.usdc` maps by its first label), or null. */
export function railOf(method: string, map: Readonly<Record<string, RailName>>): RailName | null {
  const m = method.trim().toLowerCase()
  const exact = map[m]
  if (exact) return exact
  const head = m.split(/[.:/]/)[0]!
  return map[head] ?? null
}

/**
 * Why the stablecoin rail cannot pay this offer on the configured chain, or null when
 * it can: a named network must be the chain, a named token must be the chain's token.
 */
export function stablecoinMismatch(offer: MppOffer, chain: PayableChain): string | null {
  if (offer.network !== null && !namesChain(offer.network, chain)) return `network ${offer.network} is not ${chain.networkName}`
  if (offer.token !== null && offer.token.toLowerCase() !== chain.token.toLowerCase()) return `token ${offer.token} is not the chain's token`
  return null
}

export interface RailChoice {
  rail: RailName
  /** The literal identifier as offered (echoed when paying). */
  method: string
}

/**
 * The rail to pay with: the stablecoin rail when a payable stablecoin method is offered;
 * else the card rail when a card method is offered and `available` has it; else another
 * available rail (e.g. lightning, custom), in offer order. Null: nothing payable here.
 */
export function chooseRail(offer: MppOffer, map: Readonly<Record<string, RailName>>, available: ReadonlySet<RailName>, chain: PayableChain): { choice: RailChoice | null; why: string } {
  const offered = offer.methods.map((method) => ({ method, rail: railOf(method, map) }))
  const stable = offered.find((o) => o.rail === 'stablecoin')
  const mismatch = stable ? stablecoinMismatch(offer, chain) : null
  if (stable && mismatch === null) return { choice: { rail: 'stablecoin', method: stable.method }, why: '' }
  const card = offered.find((o) => o.rail === 'card')
  if (card && available.has('card')) return { choice: { rail: 'card', method: card.method }, why: '' }
  const other = offered.find((o) => o.rail !== null && o.rail !== 'stablecoin' && o.rail !== 'card' && available.has(o.rail))
  if (other) return { choice: { rail: other.rail!, method: other.method }, why: '' }
  const reasons: string[] = []
  if (mismatch) reasons.push(`stablecoin: ${mismatch}`)
  if (card) reasons.push('card: no card provider is configured')
  const unknown = offered.filter((o) => o.rail === null).map((o) => o.method)
  if (unknown.length) reasons.push(`unknown methods: ${unknown.join(', ')} (map them in mpp.methods)`)
  const missing = offered.filter((o) => o.rail !== null && o.rail !== 'stablecoin' && o.rail !== 'card' && !available.has(o.rail)).map((o) => o.method)
  if (missing.length) reasons.push(`no rail installed for ${missing.join(', ')}`)
  return { choice: null, why: reasons.join('; ') || 'no payment method offered' }
}

// ---------------------------------------------------------------------------
// the stablecoin rail's authorizations

/** EIP-712 payment intent (when the 402 names no `payTo`): a signed promise the merchant verifies by recovery. */
export const PAYMENT_INTENT_TYPES = {
  PaymentIntent: [
    { name: 'payer', type: 'address' },
    { name: 'amount', type: 'uint256' },
    { name: 'currency', type: 'string' },
    { name: 'resource', type: 'string' },
    { name: 'nonce', type: 'bytes32' },
    { name: 'expiry', type: 'uint256' },
  ],
} as const

export const PAYMENT_INTENT_DOMAIN_NAME = 'Paygate MPP'
export const PAYMENT_INTENT_DOMAIN_VERSION = '1'

export interface PaymentIntent {
  payer: Address
  /** USDC base units. */
  amount: bigint
  /** The offered currency, upper case. */
  currency: string
  resource: string
  nonce: Hex
  /** Unix seconds. */
  expiry: bigint
}

export function paymentIntentTypedData(intent: PaymentIntent, chainId: number) {
  return {
    domain: { name: PAYMENT_INTENT_DOMAIN_NAME, version: PAYMENT_INTENT_DOMAIN_VERSION, chainId },
    types: PAYMENT_INTENT_TYPES,
    primaryType: 'PaymentIntent' as const,
    message: intent,
  }
}

/** The `authorization` object of the payment POST, per rail. */
export type MppAuthorization =
  | {
      type: 'eip3009'
      network: string
      token: Address
      from: Address
      to: Address
      value: string
      validAfter: string
      validBefore: string
      nonce: Hex
      signature: Hex
    }
  | {
      type: 'eip712-intent'
      chainId: number
      payer: Address
      amount: string
      currency: string
      resource: string
      nonce: Hex
      expiry: string
      signature: Hex
    }
  | { type: 'card'; provider: string; token: string }
  | { type: string; [k: string]: unknown }

export function eip3009Authorization(auth: Eip3009Authorization, signature: Hex, chain: PayableChain): MppAuthorization {
  return { type: 'eip3009', network: `eip155:${chain.chainId}`, token: chain.token, ...authorizationJson(auth), signature }
}

export function intentAuthorization(intent: PaymentIntent, signature: Hex, chainId: number): MppAuthorization {
  return {
    type: 'eip712-intent',
    chainId,
    payer: intent.payer,
    amount: intent.amount.toString(),
    currency: intent.currency,
    resource: intent.resource,
    nonce: intent.nonce,
    expiry: intent.expiry.toString(),
    signature,
  }
}

/** The JSON POSTed to `paymentEndpoint`. */
export function paymentBody(offer: MppOffer, method: string, authorization: MppAuthorization, resource: string): Buffer {
  return Buffer.from(JSON.stringify({ method, amount: { value: offer.value, currency: offer.currency }, authorization, resource }))
}

// ---------------------------------------------------------------------------
// sessions

/**
 * When a session from this answer expires (ms): `X-MPP-Session-Expires` as delta seconds
 * or a date; else the offer's `sessionTtlSeconds`; else `defaultTtlSeconds`.
 */
export function sessionExpiry(headers: HttpAnswer['headers'], offer: Pick<MppOffer, 'sessionTtlSeconds'> | null, now: number, defaultTtlSeconds: number): number {
  const raw = headers[SESSION_EXPIRES_HEADER]
  const v = (Array.isArray(raw) ? raw[0] : raw)?.trim()
  if (v) {
    if (/^\d{1,10}$/.test(v)) return now + Number(v) * 1000
    const t = Date.parse(v)
    if (Number.isFinite(t)) return t
  }
  return now + (offer?.sessionTtlSeconds ?? defaultTtlSeconds) * 1000
}

/** The session token of an answer, if it carries one that is safe to send back as a header. */
export function sessionToken(headers: HttpAnswer['headers']): string | null {
  const raw = headers[SESSION_HEADER]
  const v = (Array.isArray(raw) ? raw[0] : raw)?.trim()
  return v && v.length <= 4096 && /^[\x21-\x7e]+$/.test(v) ? v : null
}
