import { createRequire } from 'node:module'
import type { Hex } from 'viem'

/**
 * Native keccak-256 (the `keccak` package: the XKCP implementation with prebuilt binaries,
 * falling back to JS where none loads), about twice as fast as viem's pure-JS keccak on
 * the paid path's inputs. Same digests.
 */
const require = createRequire(import.meta.url)
const createHash = require('keccak') as (algorithm: 'keccak256') => { update(data: Uint8Array): { digest(): Buffer } }

/** keccak256 of bytes, of 0x-hex, or (with `utf8`) of a string's UTF-8 bytes. */
export function keccak256(data: Uint8Array | Hex | string, input: 'hex' | 'utf8' = 'hex'): Hex {
  const bytes = typeof data !== 'string' ? data : input === 'utf8' ? Buffer.from(data, 'utf8') : Buffer.from(data.slice(2), 'hex')
  return `0x${createHash('keccak256').update(bytes).digest().toString('hex')}`
}
