/**
 * The EIP-712 digest of a TransferWithAuthorization computed directly with keccak, for
 * the paid path: the same 32 bytes as viem's `hashTypedData`, at a fraction of the cost.
 */
import { keccak256Bytes } from '../../crypto/keccak.js'
import { MAX_UINT256 } from '../../util/money.js'
import type { Hex } from '../types.js'
import type { TransferWithAuthorizationTypedData } from './payment.js'
import { fail } from './wire.js'

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
