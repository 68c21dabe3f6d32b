import { randomBytes, randomFillSync } from 'node:crypto'

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'

/**
 * CSPRNG bytes served from one pool, refilled by a single randomFillSync when used up:
 * a transaction id and a payment nonce per paid call would otherwise cost a syscall
 * each. Bytes are handed out front to back and never twice; what is left at the end
 * when a request does not fit is skipped, not reused.
 */
const POOL_BYTES = 8192
const pool = Buffer.allocUnsafeSlow(POOL_BYTES)
let next = POOL_BYTES // empty: the first use fills it

function refill(): void {
  randomFillSync(pool)
  next = 0
}

/** `bytes` random bytes as lower-case hex (no `0x`). */
export function randomHex(bytes: number): string {
  if (bytes > POOL_BYTES) return randomBytes(bytes).toString('hex')
  if (next + bytes > POOL_BYTES) refill()
  const at = next
  next += bytes
  return pool.toString('hex', at, at + bytes)
}

/** Uniform base62 string from the CSPRNG (rejection sampling, no modulo bias). */
export function randomBase62(length: number): string {
  let out = ''
  while (out.length < length) {
    if (next === POOL_BYTES) refill()
    const b = pool[next++]!
    // 248 = 4 * 62: bytes 248-255 would favour the first 8 symbols, so they are dropped.
    if (b < 248) out += BASE62[b % 62]
  }
  return out
}
