/**
 * USDC amounts: `bigint` base units inside (6 decimals), decimal numbers at the API edge.
 * Conversions go through decimal strings, never through float arithmetic.
 */
export const USDC_DECIMALS = 6
const SCALE = 10n ** BigInt(USDC_DECIMALS)

/** The largest uint256 (EVM words: token amounts, RLP and ABI integers). */
export const MAX_UINT256 = 2n ** 256n - 1n

/** Upper bound for any configured amount: 10^12 USDC keeps every sum far inside 2^63. */
export const MAX_USDC_UNITS = 10n ** 12n * SCALE

export class AmountError extends Error {
  override name = 'AmountError'
}

/**
 * Parse a decimal amount (a JSON number or a decimal string) into base units.
 * JSON numbers are read through their shortest round-trip string, so `0.1` is exactly
 * 100000 units. Throws AmountError for negatives, NaN, exponents beyond range, or more
 * than `decimals` fractional digits.
 */
export function parseDecimal(value: number | string, decimals = USDC_DECIMALS): bigint {
  let s: string
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new AmountError('must be a finite number')
    s = String(value)
  } else {
    s = value.trim()
  }
  const m = /^(-)?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/.exec(s)
  if (!m || (m[2] === '' && (m[3] ?? '') === '')) throw new AmountError('must be a decimal number')
  if (m[1]) throw new AmountError('must not be negative')
  let intPart = m[2] ?? ''
  let frac = m[3] ?? ''
  const exp = m[4] ? Number(m[4]) : 0
  if (Math.abs(exp) > 40) throw new AmountError('is out of range')
  // Shift the decimal point by the exponent.
  if (exp > 0) {
    const moved = frac.slice(0, exp).padEnd(exp, '0')
    intPart += moved
    frac = frac.slice(exp)
  } else if (exp < 0) {
    const n = -exp
    const padded = intPart.padStart(n, '0')
    frac = padded.slice(padded.length - n) + frac
    intPart = padded.slice(0, padded.length - n)
  }
  frac = frac.replace(/0+$/, '')
  if (frac.length > decimals) throw new AmountError(`has more than ${decimals} decimal places`)
  const units = BigInt(intPart || '0') * 10n ** BigInt(decimals) + BigInt(frac.padEnd(decimals, '0') || '0')
  return units
}

/** Base units to a decimal string without trailing zeros ("1.5", "0.000001", "12"). */
export function formatUnits(units: bigint, decimals = USDC_DECIMALS): string {
  const neg = units < 0n
  const abs = neg ? -units : units
  const scale = 10n ** BigInt(decimals)
  const int = abs / scale
  const frac = (abs % scale).toString().padStart(decimals, '0').replace(/0+$/, '')
  return `${neg ? '-' : ''}${int}${frac ? `.${frac}` : ''}`
}

/** Base units to the JSON number the API shows; exact for every value a 6-decimal string can print. */
export const toUsdcNumber = (units: bigint): number => Number(formatUnits(units))

export const usdc = (units: bigint): { usdc: number } => ({ usdc: toUsdcNumber(units) })
