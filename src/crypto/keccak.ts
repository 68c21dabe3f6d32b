import { createRequire } from 'node:module'
import { dirname } from 'node:path'
import type { Hex } from 'viem'

/**
 * Native keccak-256 (the `keccak` package: the XKCP implementation with prebuilt binaries,
 * falling back to its JS state where no binary loads). Same digests as viem's keccak256.
 *
 * The package's `createHash` wraps every hash in a readable-stream Transform, which costs
 * more than hashing the few hundred bytes of the paid path's inputs; its sponge state is
 * used directly instead, one instance reused (hashing is synchronous).
 */
interface KeccakState {
  initialize(rate: number, capacity: number): void
  absorb(data: Buffer): void
  squeeze(length: number): Buffer
}

const require = createRequire(import.meta.url)
const keccakMain = require.resolve('keccak')
const fromKeccak = createRequire(keccakMain)

function loadState(): new () => KeccakState {
  try {
    // What the package's own bindings.js loads: the prebuilt addon exports the state class.
    const native = (fromKeccak('node-gyp-build') as (dir: string) => unknown)(dirname(keccakMain))
    if (typeof native === 'function') return native as new () => KeccakState
  } catch {
    // no usable binary: the package's JS state below
  }
  return fromKeccak('./lib/keccak') as new () => KeccakState
}

const state = new (loadState())()
/** keccak-256: rate 1088 bits, capacity 512; the original Keccak padding (not SHA-3's). */
const RATE = 1088
const CAPACITY = 512

/** keccak256 of bytes, as 32 bytes (no hex round trip for callers that keep working in bytes). */
export function keccak256Bytes(data: Uint8Array): Buffer {
  state.initialize(RATE, CAPACITY)
  state.absorb(Buffer.isBuffer(data) ? data : Buffer.from(data.buffer, data.byteOffset, data.byteLength))
  return state.squeeze(32)
}

/** keccak256 of bytes, of 0x-hex, or (with `utf8`) of a string's UTF-8 bytes. */
export function keccak256(data: Uint8Array | Hex | string, input: 'hex' | 'utf8' = 'hex'): Hex {
  const bytes = typeof data !== 'string' ? data : input === 'utf8' ? Buffer.from(data, 'utf8') : Buffer.from(data.slice(2), 'hex')
  return `0x${keccak256Bytes(bytes).toString('hex')}`
}
