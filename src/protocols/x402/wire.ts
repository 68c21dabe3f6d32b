/**
 * x402's small wire readers, shared by the detection, payment and settlement files:
 * base64 JSON and the typed fields of an offer entry. Each throws a PaygateError
 * (`payment_protocol_error`) naming the bad field.
 */
import { getAddress, isAddress } from 'viem'
import { PaygateError } from '../../errors/index.js'
import { MAX_UINT256 } from '../../util/money.js'
import type { Address, HttpAnswer, Offer } from '../types.js'

export type X402Shape = 'x402-v1' | 'x402-v2' | 'spec-simple' | 'spec-accepts'

/** Used when an offer names no timeout (the spec's simple shape); x402-express's default. */
export const DEFAULT_TIMEOUT_SECONDS = 60
export type Json = Record<string, unknown>

export const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v)

export const fail = (message: string): never => {
  throw new PaygateError('payment_protocol_error', message)
}

export const messageOf = (e: unknown): string => (e instanceof PaygateError ? e.detail : e instanceof Error ? e.message : String(e))

/** Every value of a header, split neither on commas nor otherwise (base64 has none). */
export function headerValues(headers: HttpAnswer['headers'], name: string): string[] {
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

export function parseAddress(v: unknown, field: string): Address {
  if (typeof v !== 'string' || !isAddress(v.trim(), { strict: false })) {
    return fail(`${field} must be an EVM address, got ${JSON.stringify(v)}`)
  }
  return getAddress(v.trim())
}

export function parseString(v: unknown, field: string): string {
  if (typeof v !== 'string' || v.trim() === '') return fail(`${field} must be a non-empty string`)
  return v.trim()
}

export function parseTimeout(v: unknown, field: string): number {
  if (v === undefined || v === null) return DEFAULT_TIMEOUT_SECONDS
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) return fail(`${field} must be a positive number`)
  return Math.floor(v)
}

export function parseResource(v: unknown, field: string): string | null {
  if (v === undefined || v === null || v === '') return null
  if (typeof v !== 'string') return fail(`${field} must be a string`)
  return v.trim()
}

export function parseExtra(v: unknown): Offer['extra'] {
  if (v === undefined || v === null) return {}
  if (!isObject(v)) return fail('extra must be an object')
  const out: Offer['extra'] = {}
  if (typeof v.name === 'string' && v.name !== '') out.name = v.name
  if (typeof v.version === 'string' && v.version !== '') out.version = v.version
  if (typeof v.assetTransferMethod === 'string') out.assetTransferMethod = v.assetTransferMethod
  return out
}
