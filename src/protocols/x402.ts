/**
 * x402, pure: read the offers of a 402 answer, decide which one Paygate can pay, build
 * the EIP-712 data to sign, and encode the payment headers; read the settlement header
 * of the paid answer. No sockets, no storage, no keys.
 *
 * Four wire shapes are read (verified against x402@1.2.0, x402-express@1.2.0 and
 * @x402/core, @x402/evm, @x402/express 2.27.0):
 * - `x402-v1`: body `{x402Version:1, error, accepts:[{scheme, network, maxAmountRequired,
 *   resource, description, mimeType, payTo, maxTimeoutSeconds, asset, extra}]}`;
 *   paid with `X-PAYMENT: base64(JSON {x402Version:1, scheme, network,
 *   payload:{signature, authorization}})`; answered with `X-PAYMENT-RESPONSE`.
 * - `x402-v2`: header `PAYMENT-REQUIRED: base64(JSON {x402Version:2, error,
 *   resource:{url,...}, accepts:[{scheme, network:"eip155:<id>", amount, asset, payTo,
 *   maxTimeoutSeconds, extra}], extensions?})`, body `{}`; paid with
 *   `PAYMENT-SIGNATURE: base64(JSON {x402Version:2, payload:{authorization, signature},
 *   extensions?, resource, accepted})` where `accepted` must deep-equal the offered entry;
 *   answered with `PAYMENT-RESPONSE`.
 * - `spec-simple`: body `{scheme, network, token, amount, payTo, resource}`.
 * - `spec-accepts`: body `{accepts:[{scheme, network, maxAmountRequired, resource,
 *   description, mimeType, payToAddress, requiredDeadlineSeconds, asset, extra}]}`.
 *   Both spec shapes are paid with `X-PAYMENT: base64(JSON {scheme, network,
 *   payload:{from,to,amount,token,nonce,validAfter,validBefore}, signature})` plus
 *   `X-PAYMENT-SIGNATURE: <signature>`.
 */
import { getAddress, isAddress, type TypedDataDefinition } from 'viem'
import { keccak256Bytes } from '../crypto/keccak.js'
import { PaygateError } from '../errors/index.js'
import { deepFreeze, Lru } from '../util/lru.js'
import { MAX_UINT256 } from '../util/money.js'
import type { Address, Detection, Eip3009Authorization, Hex, HttpAnswer, Offer, PayableChain, Problem, Settlement, TokenDomain } from './types.js'

export type X402Shape = 'x402-v1' | 'x402-v2' | 'spec-simple' | 'spec-accepts'

/**
 * x402 v1 network names and their chain ids: the union of x402@1.2.0's
 * `EvmNetworkToChainId` and @x402/evm 2.27.0's `EVM_NETWORK_CHAIN_ID_MAP` (which the v2
 * packages use for v1 payloads). v1 servers and facilitators only know these names.
 */
export const X402_V1_NETWORKS: Readonly<Record<string, number>> = Object.freeze({
  ethereum: 1,
  sepolia: 11155111,
  abstract: 2741,
  'abstract-testnet': 11124,
  'base-sepolia': 84532,
  base: 8453,
  'avalanche-fuji': 43113,
  avalanche: 43114,
  iotex: 4689,
  sei: 1329,
  'sei-testnet': 1328,
  polygon: 137,
  'polygon-amoy': 80002,
  peaq: 3338,
  story: 1514,
  educhain: 41923,
  'skale-base-sepolia': 324705682,
  megaeth: 4326,
  monad: 143,
  stable: 988,
  'stable-testnet': 2201,
  celo: 42220,
  flare: 14,
})

/** The EIP-712 types of EIP-3009 `transferWithAuthorization`. */
export const TRANSFER_WITH_AUTHORIZATION_TYPES = {
  TransferWithAuthorization: [
    { name: 'from', type: 'address' },
    { name: 'to', type: 'address' },
    { name: 'value', type: 'uint256' },
    { name: 'validAfter', type: 'uint256' },
    { name: 'validBefore', type: 'uint256' },
    { name: 'nonce', type: 'bytes32' },
  ],
} as const

export type TransferWithAuthorizationTypedData = TypedDataDefinition<typeof TRANSFER_WITH_AUTHORIZATION_TYPES, 'TransferWithAuthorization'> & {
  domain: { name: string; version: string; chainId: number; verifyingContract: Address }
  message: Eip3009Authorization
}

/** Used when an offer names no timeout (the spec's simple shape); x402-express's default. */
export const DEFAULT_TIMEOUT_SECONDS = 60
/** A body larger than this is not parsed for offers. */
const MAX_BODY_BYTES = 1024 * 1024

// ---------------------------------------------------------------------------
// small readers

type Json = Record<string, unknown>

const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v)

const fail = (message: string): never => {
  throw new PaygateError('payment_protocol_error', message)
}

const messageOf = (e: unknown): string => (e instanceof PaygateError ? e.detail : e instanceof Error ? e.message : String(e))

/** Every value of a header, split neither on commas nor otherwise (base64 has none). */
function headerValues(headers: HttpAnswer['headers'], name: string): string[] {
  const v = headers[name]
  if (v === undefined) return []
  return (Array.isArray(v) ? v : [v]).map((s) => s.trim()).filter((s) => s !== '')
}

/** Base64 (standard or URL-safe, padding optional) of UTF-8 JSON. Throws PaygateError. */
export function decodeBase64Json(value: string): unknown {
  const s = value.replace(/\s+/g, '')
  if (!/^[A-Za-z0-9+/_-]*={0,2}$/.test(s) || s.length === 0) fail('is not base64')
  let text: string
  try {
    text = Buffer.from(s.replace(/-/g, '+').replace(/_/g, '/'), 'base64').toString('utf8')
  } catch {
    return fail('is not base64')
  }
  try {
    return JSON.parse(text) as unknown
  } catch {
    return fail('is not base64 of JSON')
  }
}

/** Standard padded base64 of UTF-8 JSON, as the official packages send it. */
export const encodeBase64Json = (value: unknown): string => Buffer.from(JSON.stringify(value), 'utf8').toString('base64')

function parseBodyText(raw: string): { json: unknown } | { problem: string } | null {
  const text = raw.replace(/^\uFEFF/, '').trim()
  if (!text.startsWith('{')) return null
  try {
    return { json: JSON.parse(text) as unknown }
  } catch {
    return { problem: 'body starts like JSON but does not parse' }
  }
}

/** Base units from a decimal string (or a safe integer JSON number). */
export function parseAmount(v: unknown, field: string): bigint {
  let s: string
  if (typeof v === 'string') s = v.trim()
  else if (typeof v === 'number' && Number.isSafeInteger(v)) s = String(v)
  else return fail(`${field} must be a decimal string of base units`)
  if (!/^\d+$/.test(s)) return fail(`${field} must be a non-negative integer of base units, got ${JSON.stringify(v)}`)
  const n = BigInt(s)
  if (n > MAX_UINT256) return fail(`${field} exceeds 2^256-1`)
  return n
}

function parseAddress(v: unknown, field: string): Address {
  if (typeof v !== 'string' || !isAddress(v.trim(), { strict: false })) {
    return fail(`${field} must be an EVM address, got ${JSON.stringify(v)}`)
  }
  return getAddress(v.trim())
}

function parseString(v: unknown, field: string): string {
  if (typeof v !== 'string' || v.trim() === '') return fail(`${field} must be a non-empty string`)
  return v.trim()
}

function parseTimeout(v: unknown, field: string): number {
  if (v === undefined || v === null) return DEFAULT_TIMEOUT_SECONDS
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) return fail(`${field} must be a positive number`)
  return Math.floor(v)
}

function parseResource(v: unknown, field: string): string | null {
  if (v === undefined || v === null || v === '') return null
  if (typeof v !== 'string') return fail(`${field} must be a string`)
  return v.trim()
}

function parseExtra(v: unknown): Offer['extra'] {
  if (v === undefined || v === null) return {}
  if (!isObject(v)) return fail('extra must be an object')
  const out: Offer['extra'] = {}
  if (typeof v.name === 'string' && v.name !== '') out.name = v.name
  if (typeof v.version === 'string' && v.version !== '') out.version = v.version
  if (typeof v.assetTransferMethod === 'string') out.assetTransferMethod = v.assetTransferMethod
  return out
}

// ---------------------------------------------------------------------------
// detection

interface EntryContext {
  shape: X402Shape
  index: number
  envelope: unknown
  /** v2: the PAYMENT-REQUIRED object's `resource.url`. */
  resource?: string | null
}

/** Read one offer entry of a given shape; throws PaygateError naming the bad field. */
function readEntry(entry: unknown, ctx: EntryContext): Offer {
  if (!isObject(entry)) return fail('entry is not an object')
  const base = {
    protocol: 'x402' as const,
    shape: ctx.shape,
    scheme: parseString(entry.scheme, 'scheme'),
    network: parseString(entry.network, 'network'),
    raw: entry,
    envelope: ctx.envelope,
    index: ctx.index,
  }
  switch (ctx.shape) {
    case 'x402-v1':
      return {
        ...base,
        amount: parseAmount(entry.maxAmountRequired, 'maxAmountRequired'),
        payTo: parseAddress(entry.payTo, 'payTo'),
        asset: parseAddress(entry.asset, 'asset'),
        resource: parseResource(entry.resource, 'resource'),
        maxTimeoutSeconds: parseTimeout(entry.maxTimeoutSeconds, 'maxTimeoutSeconds'),
        extra: parseExtra(entry.extra),
      }
    case 'x402-v2':
      return {
        ...base,
        amount: parseAmount(entry.amount, 'amount'),
        payTo: parseAddress(entry.payTo, 'payTo'),
        asset: parseAddress(entry.asset, 'asset'),
        resource: ctx.resource ?? null,
        maxTimeoutSeconds: parseTimeout(entry.maxTimeoutSeconds, 'maxTimeoutSeconds'),
        extra: parseExtra(entry.extra),
      }
    case 'spec-accepts': {
      // The spec's names first; x402's names accepted as well.
      const amountField = entry.maxAmountRequired !== undefined ? 'maxAmountRequired' : 'amount'
      const payToField = entry.payToAddress !== undefined ? 'payToAddress' : 'payTo'
      const timeoutField = entry.requiredDeadlineSeconds !== undefined ? 'requiredDeadlineSeconds' : 'maxTimeoutSeconds'
      return {
        ...base,
        amount: parseAmount(entry[amountField], amountField),
        payTo: parseAddress(entry[payToField], payToField),
        asset: parseAddress(entry.asset ?? entry.token, entry.asset !== undefined ? 'asset' : 'token'),
        resource: parseResource(entry.resource, 'resource'),
        maxTimeoutSeconds: parseTimeout(entry[timeoutField], timeoutField),
        extra: parseExtra(entry.extra),
      }
    }
    case 'spec-simple':
      return {
        ...base,
        amount: parseAmount(entry.amount, 'amount'),
        payTo: parseAddress(entry.payTo, 'payTo'),
        asset: parseAddress(entry.token ?? entry.asset, entry.token !== undefined ? 'token' : 'asset'),
        resource: parseResource(entry.resource, 'resource'),
        maxTimeoutSeconds: parseTimeout(entry.maxTimeoutSeconds ?? entry.requiredDeadlineSeconds, 'maxTimeoutSeconds'),
        extra: parseExtra(entry.extra),
      }
  }
}

interface Collector {
  offers: Offer[]
  problems: Problem[]
}

function readEntries(list: unknown, ctx: Omit<EntryContext, 'index'>, out: Collector): void {
  if (!Array.isArray(list)) {
    out.problems.push({ shape: ctx.shape, message: 'accepts must be an array' })
    return
  }
  if (list.length === 0) out.problems.push({ shape: ctx.shape, message: 'accepts is empty' })
  list.forEach((entry, index) => {
    try {
      out.offers.push(readEntry(entry, { ...ctx, index }))
    } catch (e) {
      out.problems.push({ shape: ctx.shape, index, message: messageOf(e) })
    }
  })
}

/** v2 PaymentRequired object (from the header, or a body when no header was usable). */
function readV2(obj: Json, out: Collector): void {
  let resource: string | null = null
  if (isObject(obj.resource)) {
    try {
      resource = parseResource(obj.resource.url, 'resource.url')
    } catch (e) {
      out.problems.push({ shape: 'x402-v2', message: messageOf(e) })
    }
  } else if (obj.resource !== undefined && obj.resource !== null) {
    out.problems.push({ shape: 'x402-v2', message: 'resource must be an object' })
  }
  const envelope = { resource: obj.resource ?? null, extensions: obj.extensions ?? null }
  readEntries(obj.accepts, { shape: 'x402-v2', envelope, resource }, out)
}

/** Does a JSON body look like the spec's simple shape (and not MPP's `amount:{value,currency}`)? */
const looksSimple = (b: Json): boolean => ('token' in b || 'payTo' in b) && 'amount' in b && !isObject(b.amount) && ('scheme' in b || 'network' in b)

/**
 * What one PAYMENT-REQUIRED value or one body says on its own: a pure function of that
 * text, so it is cached (a merchant sends the same challenge on every 402). Cached
 * readings are deep-frozen: offers are shared between calls and must not change.
 */
interface Reading {
  readonly offers: readonly Offer[]
  readonly problems: readonly Problem[]
  readonly recognized: boolean
  /** A v2 PaymentRequired object (a body one is skipped when a header gave one). */
  readonly v2: boolean
}

const NOTHING: Reading = Object.freeze({ offers: Object.freeze([]), problems: Object.freeze([]), recognized: false, v2: false })
/** Readings kept per kind; texts longer than MAX_CACHED_TEXT are read every time (bounds memory). */
const CACHE_ENTRIES = 256
const MAX_CACHED_TEXT = 8 * 1024
const headerReadings = new Lru<string, Reading>(CACHE_ENTRIES)
const bodyReadings = new Lru<string, Reading>(CACHE_ENTRIES)

function cachedReading(cache: Lru<string, Reading>, text: string, read: (text: string) => Reading): Reading {
  if (text.length > MAX_CACHED_TEXT) return read(text)
  let r = cache.get(text)
  if (!r) {
    r = deepFreeze(read(text))
    cache.set(text, r)
  }
  return r
}

function readHeaderValue(value: string): Reading {
  const out: Collector = { offers: [], problems: [] }
  let v2 = false
  let obj: unknown
  try {
    obj = decodeBase64Json(value)
  } catch (e) {
    out.problems.push({ shape: 'x402-v2', message: `PAYMENT-REQUIRED header ${messageOf(e)}` })
    return { ...out, recognized: true, v2 }
  }
  if (!isObject(obj)) {
    out.problems.push({ shape: 'x402-v2', message: 'PAYMENT-REQUIRED header is not a JSON object' })
  } else if (obj.x402Version === 2) {
    v2 = true
    readV2(obj, out)
  } else if (obj.x402Version === 1) {
    readEntries(obj.accepts, { shape: 'x402-v1', envelope: null }, out)
  } else {
    out.problems.push({ shape: 'x402-v2', message: `unsupported x402Version ${JSON.stringify(obj.x402Version)}` })
  }
  return { ...out, recognized: true, v2 }
}

function readBodyText(raw: string): Reading {
  const parsed = parseBodyText(raw)
  if (parsed === null) return NOTHING
  const out: Collector = { offers: [], problems: [] }
  if ('problem' in parsed) {
    out.problems.push({ shape: 'body', message: parsed.problem })
    return { ...out, recognized: false, v2: false }
  }
  if (!isObject(parsed.json)) return NOTHING
  const body = parsed.json
  if ('x402Version' in body) {
    if (body.x402Version === 1) readEntries(body.accepts, { shape: 'x402-v1', envelope: null }, out)
    else if (body.x402Version === 2) {
      readV2(body, out)
      return { ...out, recognized: true, v2: true }
    } else out.problems.push({ shape: 'x402-v1', message: `unsupported x402Version ${JSON.stringify(body.x402Version)}` })
    return { ...out, recognized: true, v2: false }
  }
  if ('accepts' in body) {
    readEntries(body.accepts, { shape: 'spec-accepts', envelope: null }, out)
    return { ...out, recognized: true, v2: false }
  }
  if (looksSimple(body)) {
    try {
      out.offers.push(readEntry(body, { shape: 'spec-simple', index: 0, envelope: null }))
    } catch (e) {
      out.problems.push({ shape: 'spec-simple', index: 0, message: messageOf(e) })
    }
    return { ...out, recognized: true, v2: false }
  }
  return NOTHING
}

function readBody(body: Buffer): Reading {
  if (body.length === 0) return NOTHING
  if (body.length > MAX_BODY_BYTES) return { offers: [], problems: [{ shape: 'body', message: `body of ${body.length} bytes not parsed` }], recognized: false, v2: false }
  return cachedReading(bodyReadings, body.toString('utf8'), readBodyText)
}

/**
 * Every x402 offer in an answer (normally a 402), in all four shapes. A broken entry or
 * header becomes a `problem` and never hides a good offer elsewhere. Order: v2 header,
 * then body shapes, each in entry order. Offers are frozen (shared with later calls).
 */
export function detectX402(answer: HttpAnswer): Detection {
  const offers: Offer[] = []
  const problems: Problem[] = []
  let recognized = false
  let v2FromHeader = false
  for (const value of headerValues(answer.headers, 'payment-required')) {
    const r = cachedReading(headerReadings, value, readHeaderValue)
    offers.push(...r.offers)
    problems.push(...r.problems)
    recognized ||= r.recognized
    v2FromHeader ||= r.v2
  }
  const b = readBody(answer.body)
  recognized ||= b.recognized
  // A v2 body only stands in for a missing or unusable header.
  if (!(b.v2 && v2FromHeader)) {
    offers.push(...b.offers)
    problems.push(...b.problems)
  }
  return { offers, problems, recognized }
}

// ---------------------------------------------------------------------------
// choosing

/** The chain id an offer's network names, when it names one this module knows. */
export function networkChainId(network: string): number | null {
  const n = network.trim().toLowerCase()
  const m = /^eip155:(\d+)$/.exec(n)
  if (m) {
    const id = Number(m[1])
    return Number.isSafeInteger(id) ? id : null
  }
  return Object.hasOwn(X402_V1_NETWORKS, n) ? (X402_V1_NETWORKS[n] ?? null) : null
}

/** Does `network` name the configured chain? Known names must resolve to its chain id. */
export function namesChain(network: string, chain: PayableChain): boolean {
  const id = networkChainId(network)
  if (id !== null) return id === chain.chainId
  return network.trim().toLowerCase() === chain.networkName.trim().toLowerCase()
}

/**
 * Can Paygate pay this offer: EVM `exact` scheme by EIP-3009 on the configured chain in
 * the configured token. (`extra.assetTransferMethod: "permit2"` needs a Permit2 signature
 * and is not payable here.)
 */
export function isPayable(offer: Offer, chain: PayableChain): boolean {
  if (offer.protocol !== 'x402') return false
  if (offer.scheme.toLowerCase() !== 'exact') return false
  const method = offer.extra.assetTransferMethod
  if (method !== undefined && method.toLowerCase() !== 'eip3009') return false
  if (offer.asset.toLowerCase() !== chain.token.toLowerCase()) return false
  return namesChain(offer.network, chain)
}

/**
 * May this offer be paid for a request to `requestUrl`? Its resource must have the same
 * origin; an absent or relative resource counts as the request's own.
 */
export function sameOrigin(offer: Pick<Offer, 'resource'>, requestUrl: string): boolean {
  let request: URL
  try {
    request = new URL(requestUrl)
  } catch {
    return false
  }
  if (offer.resource === null) return true
  try {
    const r = new URL(offer.resource, request)
    if (r.origin === request.origin) return true
    // A merchant behind a TLS-terminating front reports the inner scheme: same host and
    // the same explicit port with only http/https swapped is the same server.
    const webSchemes = (u: URL) => u.protocol === 'http:' || u.protocol === 'https:'
    return webSchemes(r) && webSchemes(request) && r.port !== '' && r.port === request.port && r.hostname === request.hostname
  } catch {
    return false
  }
}

/**
 * The cheapest payable offer (ties: the first), or null. With `requestUrl`, offers for
 * another origin are left out too.
 */
export function choose(offers: readonly Offer[], chain: PayableChain, requestUrl?: string): Offer | null {
  let best: Offer | null = null
  for (const o of offers) {
    if (!isPayable(o, chain)) continue
    if (requestUrl !== undefined && !sameOrigin(o, requestUrl)) continue
    if (best === null || o.amount < best.amount) best = o
  }
  return best
}

// ---------------------------------------------------------------------------
// signing data

const NONCE_RE = /^0x[0-9a-fA-F]{64}$/

/**
 * The EIP-3009 authorization for an offer, as the official clients build it:
 * validBefore = now + timeout (capped by `maxValiditySeconds`); validAfter = 0 for v2,
 * now - 600 otherwise (x402 v1's client). `nonce` must be 32 random bytes.
 */
export function authorizationFor(offer: Offer, p: { from: Address; nonce: Hex; nowSeconds: number; maxValiditySeconds?: number }): Eip3009Authorization {
  if (!NONCE_RE.test(p.nonce)) fail('nonce must be 32 bytes of hex')
  const from = parseAddress(p.from, 'from')
  const now = Math.floor(p.nowSeconds)
  const timeout = Math.min(offer.maxTimeoutSeconds, p.maxValiditySeconds ?? Number.MAX_SAFE_INTEGER)
  return {
    from,
    to: offer.payTo,
    value: offer.amount,
    validAfter: offer.shape === 'x402-v2' ? 0n : BigInt(Math.max(0, now - 600)),
    validBefore: BigInt(now + timeout),
    nonce: p.nonce,
  }
}

/** EIP-712 TransferWithAuthorization typed data for `auth` under a token's domain. */
export function transferTypedData(auth: Eip3009Authorization, domain: { name: string; version: string; chainId: number; verifyingContract: Address }): TransferWithAuthorizationTypedData {
  return { domain, types: TRANSFER_WITH_AUTHORIZATION_TYPES, primaryType: 'TransferWithAuthorization', message: { ...auth } }
}

/**
 * EIP-712 TransferWithAuthorization typed data for viem `signTypedData` /
 * `hashTypedData`. Domain name/version come from the offer's `extra` (what the
 * merchant's facilitator verifies against), else from `fallbackDomain`: the token's own,
 * as the token reports it (`PayableChain.tokenDomain`; the spec's simple shape names none).
 */
export function typedData(offer: Offer, auth: Eip3009Authorization, chainId: number, fallbackDomain: TokenDomain): TransferWithAuthorizationTypedData {
  return transferTypedData(auth, {
    name: offer.extra.name ?? fallbackDomain.name,
    version: offer.extra.version ?? fallbackDomain.version,
    chainId,
    verifyingContract: offer.asset,
  })
}

// ---------------------------------------------------------------------------
// encoding the payment

/** The EIP-3009 fields as JSON strings, as every wire format carries them. */
export const authorizationJson = (a: Eip3009Authorization) => ({
  from: a.from,
  to: a.to,
  value: a.value.toString(),
  validAfter: a.validAfter.toString(),
  validBefore: a.validBefore.toString(),
  nonce: a.nonce,
})

/**
 * The request headers that carry a signed payment for `offer` (lower-case names).
 * For x402 v2 the `accepted` entry is the raw entry as received: the official server
 * deep-compares it with its own requirements.
 */
export function paymentHeaders(offer: Offer, auth: Eip3009Authorization, signature: Hex): Record<string, string> {
  if (!/^0x[0-9a-fA-F]+$/.test(signature)) fail('signature must be hex')
  // The authorization must be for this very offer: facilitators reject anything else after the fact.
  if (auth.to.toLowerCase() !== offer.payTo.toLowerCase()) fail("authorization.to differs from the offer's payTo")
  if (auth.value !== offer.amount) fail("authorization.value differs from the offer's amount")
  if (!NONCE_RE.test(auth.nonce)) fail('nonce must be 32 bytes of hex')
  const authorization = authorizationJson(auth)
  switch (offer.shape as X402Shape) {
    case 'x402-v1':
      return {
        'x-payment': encodeBase64Json({
          x402Version: 1,
          scheme: offer.scheme,
          network: offer.network,
          payload: { signature, authorization },
        }),
      }
    case 'x402-v2': {
      const env = isObject(offer.envelope) ? offer.envelope : {}
      return {
        'payment-signature': encodeBase64Json({
          x402Version: 2,
          payload: { authorization, signature },
          extensions: isObject(env.extensions) ? env.extensions : undefined,
          resource: isObject(env.resource) ? env.resource : undefined,
          accepted: offer.raw,
        }),
      }
    }
    case 'spec-simple':
    case 'spec-accepts':
      // The spec's payload, plus the x402 v1 fields so that a v1-style verifier reads it too.
      return {
        'x-payment': encodeBase64Json({
          x402Version: 1,
          scheme: offer.scheme,
          network: offer.network,
          payload: {
            from: authorization.from,
            to: authorization.to,
            amount: authorization.value,
            token: offer.asset,
            nonce: authorization.nonce,
            validAfter: authorization.validAfter,
            validBefore: authorization.validBefore,
            signature,
            authorization,
          },
          signature,
        }),
        'x-payment-signature': signature,
      }
    default:
      return fail(`unknown x402 shape ${offer.shape}`)
  }
}

// ---------------------------------------------------------------------------
// settlement

const str = (v: unknown): string | null => (typeof v === 'string' && v !== '' ? v : null)

/**
 * The settlement the merchant reported (`PAYMENT-RESPONSE`, v2, or `X-PAYMENT-RESPONSE`,
 * v1). Null when neither header is present. Never throws: an unreadable header gives
 * `success: false` with `errorReason: "unreadable_payment_response"` and the header text
 * as `raw` (the payment may still have settled; judge by the answer's status).
 */
export function readSettlement(headers: HttpAnswer['headers']): Settlement | null {
  const value = headerValues(headers, 'payment-response')[0] ?? headerValues(headers, 'x-payment-response')[0]
  if (value === undefined) return null
  let obj: unknown
  try {
    obj = decodeBase64Json(value)
  } catch {
    obj = undefined
  }
  if (!isObject(obj)) {
    return { success: false, transaction: null, network: null, payer: null, errorReason: 'unreadable_payment_response', raw: value }
  }
  return {
    success: obj.success === true,
    transaction: str(obj.transaction),
    network: str(obj.network),
    payer: str(obj.payer),
    errorReason: str(obj.errorReason),
    raw: obj,
  }
}

// ---------------------------------------------------------------------------
// fast EIP-712 digest

const TWA_TYPEHASH = keccak256Bytes(Buffer.from('TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)', 'utf8'))
const DOMAIN_TYPEHASH = keccak256Bytes(Buffer.from('EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)', 'utf8'))
const domainSeparators = new Map<string, Buffer>()
/** Scratch buffers, filled and hashed synchronously: the struct (7 words) and `0x1901 || domain || struct`. */
const structWords = Buffer.alloc(7 * 32)
TWA_TYPEHASH.copy(structWords, 0)
const signed = Buffer.alloc(66)
signed[0] = 0x19
signed[1] = 0x01

/** Write 0x-less hex (at most 64 digits) as a left-padded 32-byte word. */
const putWord = (buf: Buffer, at: number, hex: string): void => void buf.write(hex.padStart(64, '0'), at, 32, 'hex')
function putUint(buf: Buffer, at: number, v: bigint): void {
  if (v < 0n || v > MAX_UINT256) fail(`${v} is not a uint256`)
  putWord(buf, at, v.toString(16))
}

/**
 * The EIP-712 digest of `typedData(...)`, computed directly (domain separators cached,
 * keyed by the whole domain: name, version, chainId and verifyingContract):
 * the same 32 bytes as viem's `hashTypedData`, at a fraction of the cost on the paid path.
 */
export function typedDataDigest(td: TransferWithAuthorizationTypedData): Hex {
  const d = td.domain
  const dk = `${d.name}\u0000${d.version}\u0000${d.chainId}\u0000${d.verifyingContract.toLowerCase()}`
  let sep = domainSeparators.get(dk)
  if (!sep) {
    const words = Buffer.alloc(5 * 32)
    DOMAIN_TYPEHASH.copy(words, 0)
    keccak256Bytes(Buffer.from(d.name, 'utf8')).copy(words, 32)
    keccak256Bytes(Buffer.from(d.version, 'utf8')).copy(words, 64)
    putUint(words, 96, BigInt(d.chainId))
    putWord(words, 128, d.verifyingContract.slice(2))
    sep = keccak256Bytes(words)
    if (domainSeparators.size > 1000) domainSeparators.clear()
    domainSeparators.set(dk, sep)
  }
  const m = td.message
  putWord(structWords, 32, m.from.slice(2))
  putWord(structWords, 64, m.to.slice(2))
  putUint(structWords, 96, m.value)
  putUint(structWords, 128, m.validAfter)
  putUint(structWords, 160, m.validBefore)
  putWord(structWords, 192, m.nonce.slice(2))
  sep.copy(signed, 2)
  keccak256Bytes(structWords).copy(signed, 34)
  return `0x${keccak256Bytes(signed).toString('hex')}`
}
