/**
 * MPP, the published protocol (mpp.dev): the HTTP "Payment" authentication scheme, pure.
 * The `mppx` package (reference SDK) parses challenges and encodes credentials and
 * receipts; it is used only here.
 *
 * A 402 carries `WWW-Authenticate: Payment id="..", realm="..", method="evm|stripe|..",
 * intent="charge|session", request="<base64url JSON>", expires=".."[, description, opaque,
 * digest]`, several challenges possibly in one header. The paid retry carries
 * `Authorization: Payment <base64url JSON {challenge, payload, source?}>` (or the header
 * the challenge names) on the same URL, method and body; the paid answer carries
 * `Payment-Receipt: <base64url JSON {method, reference, status, timestamp}>`. Failures
 * are RFC 9457 problems whose `type` is under https://paymentauth.org/problems/.
 *
 * Paygate pays `evm/charge` (an EIP-3009 authorization whose nonce is
 * keccak256(challenge id + realm)) and `stripe/charge` (a card provider's shared payment
 * token). Other methods and intents (e.g. `session`, `tempo/charge`) are skipped.
 */
import { Challenge, Credential, Receipt } from 'mppx'
import { getAddress, isAddress, keccak256, toHex } from 'viem'
import { PaygateError, type ErrorCode } from '../errors/index.js'
import { MAX_UINT256 } from '../util/money.js'
import { toBaseUnits } from './mpp.js'
import { authorizationJson } from './x402.js'
import type { Address, Eip3009Authorization, Hex, HttpAnswer, PayableChain, Settlement } from './types.js'

export type PaymentChallenge = Challenge.Challenge

export type AuthOffer =
  | { kind: 'evm'; challenge: PaymentChallenge; amount: bigint; recipient: Address; expiresAt: number | null }
  | { kind: 'stripe'; challenge: PaymentChallenge; amount: bigint; value: string; currency: string; expiresAt: number | null }

export interface AuthDetection {
  /** Any `Payment` challenge was present (even if none could be read or paid). */
  present: boolean
  offers: AuthOffer[]
  /** Challenges that were present but expired: the 402 should be fetched again. */
  expired: number
  /** Why challenges were skipped. */
  skipped: string[]
}

/** Currencies whose Stripe amounts have no minor unit. */
const ZERO_DECIMAL = new Set(['bif', 'clp', 'djf', 'gnf', 'jpy', 'kmf', 'krw', 'mga', 'pyg', 'rwf', 'ugx', 'vnd', 'vuv', 'xaf', 'xof', 'xpf'])

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v)

/**
 * Split a WWW-Authenticate value into its challenges: a new one starts at a top-level
 * comma followed by `scheme SP` (a token not followed by `=`). Quoted strings (which may
 * hold commas) are never split.
 */
export function splitChallenges(value: string): string[] {
  const out: string[] = []
  let start = 0
  let inQuote = false
  for (let i = 0; i < value.length; i++) {
    const ch = value[i]
    if (inQuote) {
      if (ch === '\\') i++
      else if (ch === '"') inQuote = false
      continue
    }
    if (ch === '"') inQuote = true
    else if (ch === ',') {
      const rest = value.slice(i + 1)
      if (/^\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+\s+[^=\s,]/.test(rest) || /^\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+\s*$/.test(rest)) {
        out.push(value.slice(start, i).trim())
        start = i + 1
      }
    }
  }
  out.push(value.slice(start).trim())
  return out.filter((s) => s !== '')
}

function headerValues(headers: HttpAnswer['headers'], name: string): string[] {
  const v = headers[name]
  return v === undefined ? [] : Array.isArray(v) ? v : [v]
}

function uintString(v: unknown, field: string): bigint {
  if (typeof v !== 'string' || !/^\d{1,78}$/.test(v)) throw new Error(`${field} must be an integer string`)
  const n = BigInt(v)
  if (n > MAX_UINT256) throw new Error(`${field} is out of range`)
  return n
}

/**
 * Every `Payment` challenge of a 402, read one by one (a broken one never hides another).
 * `canCard`: a card rail is configured (else `stripe/charge` is skipped).
 */
export function detectPaymentAuth(answer: HttpAnswer, chain: PayableChain, opts: { nowMs: number; canCard: boolean; rates?: Readonly<Record<string, string>> }): AuthDetection {
  const det: AuthDetection = { present: false, offers: [], expired: 0, skipped: [] }
  for (const value of headerValues(answer.headers, 'www-authenticate')) {
    for (const part of splitChallenges(value)) {
      if (!/^payment\s/i.test(part)) continue
      det.present = true
      let c: PaymentChallenge
      try {
        c = Challenge.deserialize(part)
      } catch (e) {
        det.skipped.push(`unreadable Payment challenge: ${(e as Error).message}`)
        continue
      }
      const name = `${c.method}/${c.intent}`
      try {
        const expiresAt = c.expires ? Date.parse(c.expires) : null
        if (expiresAt !== null && !Number.isFinite(expiresAt)) throw new Error('expires is not a date')
        if (expiresAt !== null && expiresAt <= opts.nowMs) {
          det.expired++
          det.skipped.push(`${name} challenge ${c.id} expired at ${c.expires}`)
          continue
        }
        const r = c.request
        if (c.method === 'evm' && c.intent === 'charge') {
          const details = isObject(r.methodDetails) ? r.methodDetails : {}
          if (details.chainId !== chain.chainId) throw new Error(`chainId ${String(details.chainId)} is not ${chain.chainId}`)
          if (typeof r.currency !== 'string' || !isAddress(r.currency, { strict: false }) || getAddress(r.currency) !== getAddress(chain.token)) {
            throw new Error(`currency ${String(r.currency)} is not the chain's token`)
          }
          if (Array.isArray(details.credentialTypes) && !details.credentialTypes.includes('authorization')) throw new Error('authorization credentials are not accepted')
          if (Array.isArray(details.splits) && details.splits.length > 0) throw new Error('split payments are not supported')
          if (typeof r.recipient !== 'string' || !isAddress(r.recipient, { strict: false })) throw new Error('recipient must be an address')
          det.offers.push({ kind: 'evm', challenge: c, amount: uintString(r.amount, 'amount'), recipient: getAddress(r.recipient), expiresAt })
        } else if (c.method === 'stripe' && c.intent === 'charge') {
          if (!opts.canCard) throw new Error('no card provider is configured')
          const minor = uintString(r.amount, 'amount')
          const currency = String(r.currency ?? '').toLowerCase()
          if (!/^[a-z]{3}$/.test(currency)) throw new Error('currency must be an ISO code')
          const decimals = ZERO_DECIMAL.has(currency) ? 0 : 2
          const s = minor.toString().padStart(decimals + 1, '0')
          const value = decimals ? `${s.slice(0, -decimals)}.${s.slice(-decimals)}` : s
          det.offers.push({ kind: 'stripe', challenge: c, amount: toBaseUnits(value, currency, opts.rates ?? {}), value, currency, expiresAt })
        } else {
          det.skipped.push(`${name} is not supported`)
        }
      } catch (e) {
        det.skipped.push(`${name}: ${e instanceof PaygateError ? e.detail : (e as Error).message}`)
      }
    }
  }
  return det
}

/** What Paygate can pay, for `Accept-Payment`. */
export const acceptPayment = (canCard: boolean): string => (canCard ? 'evm/charge, stripe/charge;q=0.5' : 'evm/charge')

/** The EIP-3009 nonce of an evm/charge challenge: bound to the challenge, so one challenge is paid at most once. */
export const challengeNonce = (c: PaymentChallenge): Hex => keccak256(toHex(c.id + c.realm))

/**
 * The EIP-3009 authorization for an evm/charge challenge: nonce bound to the challenge, valid
 * until it expires, and never longer than `maxSeconds` from now.
 */
export function evmAuthorization(offer: Extract<AuthOffer, { kind: 'evm' }>, from: Address, nowMs: number, maxSeconds = 300): Eip3009Authorization {
  const until = Math.min(offer.expiresAt ?? Infinity, nowMs + maxSeconds * 1000)
  return {
    from,
    to: offer.recipient,
    value: offer.amount,
    validAfter: 0n,
    validBefore: BigInt(Math.floor(until / 1000)),
    nonce: challengeNonce(offer.challenge),
  }
}

/** The request header name and value carrying a credential for `challenge`. */
export function credentialHeader(challenge: PaymentChallenge, payload: Record<string, unknown>, source?: string): [string, string] {
  const name = (challenge.header ?? 'Authorization').toLowerCase()
  return [name, Credential.serialize(Credential.from({ challenge, payload, ...(source ? { source } : {}) }))]
}

export function evmPayload(auth: Eip3009Authorization, signature: Hex): Record<string, unknown> {
  return { type: 'authorization', ...authorizationJson(auth), signature }
}

/** The `Payment-Receipt` of a paid answer as a settlement record, or null. */
export function readReceipt(headers: HttpAnswer['headers'], network: string | null): Settlement | null {
  const v = headerValues(headers, 'payment-receipt')[0]
  if (!v) return null
  try {
    const r = Receipt.deserialize(v.trim())
    return { success: r.status === 'success', transaction: r.reference ?? null, network, payer: null, errorReason: null, raw: r }
  } catch {
    return null
  }
}

/** Map an RFC 9457 problem from a refused credential to Paygate's error codes. */
export function problemCode(body: Buffer): { code: ErrorCode; type: string; detail: string } | null {
  let p: unknown
  try {
    p = JSON.parse(body.toString('utf8'))
  } catch {
    return null
  }
  if (!isObject(p) || typeof p.type !== 'string' || !p.type.startsWith('https://paymentauth.org/problems/')) return null
  const type = p.type.slice('https://paymentauth.org/problems/'.length)
  const detail = typeof p.detail === 'string' ? p.detail : type
  // `payment-insufficient` is the target finding the amount paid too low, not the wallet short
  // of funds (`insufficient_funds` is Paygate's own funds check, with required and available).
  const code: ErrorCode =
    type === 'method-unsupported'
      ? 'no_payable_offer'
      : type === 'malformed-credential' || type === 'invalid-challenge' || type === 'invalid-payload' || type === 'bad-request'
        ? 'payment_protocol_error'
        : 'payment_failed'
  return { code, type, detail }
}
