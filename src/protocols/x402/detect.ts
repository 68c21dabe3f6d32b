/**
 * x402 detection: every offer of a 402 answer in the four wire shapes (see ../x402.ts),
 * with a problem for each broken entry. Readings of one header value or one body are
 * cached, as a merchant sends the same challenge on every 402.
 */
import { deepFreeze, Lru } from '../../util/lru.js'
import type { Detection, HttpAnswer, Offer, Problem } from '../types.js'
import { headerValues, isObject, type Json, messageOf, parseAddress, parseAmount, parseExtra, parseResource, parseString, parseTimeout, decodeBase64Json, type X402Shape, fail } from './wire.js'

/** A body larger than this is not parsed for offers. */
const MAX_BODY_BYTES = 1024 * 1024

function parseBodyText(raw: string): { json: unknown } | { problem: string } | null {
  const text = raw.replace(/^\uFEFF/, '').trim()
  if (!text.startsWith('{')) return null
  try {
    return { json: JSON.parse(text) as unknown }
  } catch {
    return { problem: 'body starts like JSON but does not parse' }
  }
}

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
