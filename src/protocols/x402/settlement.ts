/** Reading the settlement header of a paid x402 answer. */
import type { HttpAnswer, Settlement } from '../types.js'
import { decodeBase64Json, headerValues, isObject } from './wire.js'

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
