/**
 * Direct EIP-1559 (type 2) transaction bytes: a small RLP encoder for the one shape the
 * ledger outbox makes (signed, or unsigned for the embedded chain), in place of viem's generic
 * serializer (hex strings, per-field objects) on the paid path, and the reader the embedded
 * chain's front takes unsigned ones apart with. Bytes are identical to viem's
 * `serializeTransaction` (test/unit/ledger-tx.test.ts compares them on randomized inputs).
 */
import { MAX_UINT256 } from '../util/money.js'

export interface Eip1559Fields {
  chainId: number
  nonce: bigint
  maxPriorityFeePerGas: bigint
  maxFeePerGas: bigint
  gas: bigint
  /** 20 bytes. */
  to: Uint8Array
  value: bigint
  data: Uint8Array
}

/** A secp256k1 signature: r and s as 32 big-endian bytes each. */
export interface TxSignature {
  r: Uint8Array
  s: Uint8Array
  yParity: 0 | 1
}

const EMPTY = Buffer.alloc(0)
const TYPE = Buffer.of(0x02)
/** An empty access list: the RLP of an empty list. */
const EMPTY_LIST = Buffer.of(0xc0)

/** Minimal big-endian bytes of a non-negative integer (zero is empty), as RLP wants. */
export function uintBytes(v: bigint, field: string): Buffer {
  if (v < 0n || v > MAX_UINT256) throw new RangeError(`${field} out of range: ${v}`)
  if (v === 0n) return EMPTY
  const hex = v.toString(16)
  return Buffer.from(hex.length % 2 ? `0${hex}` : hex, 'hex')
}

/** Big-endian bytes without leading zeros (viem's `trim` of r and s). */
function trimmed(b: Uint8Array): Uint8Array {
  let i = 0
  while (i < b.length && b[i] === 0) i++
  return b.subarray(i)
}

/** The RLP length prefix for a string (0x80) or list (0xc0) of `len` bytes. */
function prefix(base: 0x80 | 0xc0, len: number): Buffer {
  if (len <= 55) return Buffer.of(base + len)
  const lenBytes = uintBytes(BigInt(len), 'rlp length')
  return Buffer.concat([Buffer.of(base + 55 + lenBytes.length), lenBytes])
}

/** RLP of one byte string. */
export function rlpString(b: Uint8Array): Buffer {
  if (b.length === 1 && b[0]! < 0x80) return Buffer.from(b)
  return Buffer.concat([prefix(0x80, b.length), b])
}

/** RLP of a list whose items are already RLP-encoded. */
export function rlpList(items: readonly Uint8Array[]): Buffer {
  let len = 0
  for (const i of items) len += i.length
  return Buffer.concat([prefix(0xc0, len), ...items])
}

/** The field items shared by the signing payload and the signed transaction. */
function fieldItems(f: Eip1559Fields): Buffer[] {
  if (!Number.isSafeInteger(f.chainId) || f.chainId <= 0) throw new RangeError(`chainId must be a positive integer, got ${f.chainId}`)
  if (f.nonce >= 2n ** 64n) throw new RangeError(`nonce out of range: ${f.nonce}`)
  if (f.maxPriorityFeePerGas > f.maxFeePerGas) throw new RangeError('maxPriorityFeePerGas above maxFeePerGas')
  if (f.to.length !== 20) throw new RangeError('to must be 20 bytes')
  return [
    rlpString(uintBytes(BigInt(f.chainId), 'chainId')),
    rlpString(uintBytes(f.nonce, 'nonce')),
    rlpString(uintBytes(f.maxPriorityFeePerGas, 'maxPriorityFeePerGas')),
    rlpString(uintBytes(f.maxFeePerGas, 'maxFeePerGas')),
    rlpString(uintBytes(f.gas, 'gas')),
    rlpString(f.to),
    rlpString(uintBytes(f.value, 'value')),
    rlpString(f.data),
    EMPTY_LIST,
  ]
}

/**
 * `0x02 || rlp([fields..., accessList])`, the bytes whose keccak is signed; with `sig`,
 * `0x02 || rlp([fields..., accessList, yParity, r, s])`, the raw signed transaction.
 */
export function serializeEip1559(f: Eip1559Fields, sig?: TxSignature): Buffer {
  const items = fieldItems(f)
  return sig ? signed(items, sig) : Buffer.concat([TYPE, rlpList(items)])
}

function signed(items: Buffer[], sig: TxSignature): Buffer {
  const all = [...items, rlpString(sig.yParity ? Buffer.of(1) : EMPTY), rlpString(trimmed(sig.r)), rlpString(trimmed(sig.s))]
  return Buffer.concat([TYPE, rlpList(all)])
}

/**
 * The transaction with a zero signature (yParity, r and s all zero): what anvil holds for a
 * transaction it took from an impersonated account (eth_sendTransaction), which it never signs.
 */
export function unsignedEip1559(f: Eip1559Fields): Buffer {
  return signed(fieldItems(f), { r: EMPTY, s: EMPTY, yParity: 0 })
}

/** Sign (`sign` gets the payload bytes, hashes and signs them) and serialize, encoding the fields once. */
export function signEip1559(f: Eip1559Fields, sign: (payload: Buffer) => TxSignature): Buffer {
  const items = fieldItems(f)
  return signed(items, sign(Buffer.concat([TYPE, rlpList(items)])))
}

/** One RLP item of `b` at `at`: its payload's bounds (the next item starts at `end`) and whether it is a list. */
function item(b: Uint8Array, at: number): { start: number; end: number; list: boolean } {
  const p = b[at]
  if (p === undefined) throw new RangeError('rlp: truncated')
  if (p < 0x80) return { start: at, end: at + 1, list: false }
  const list = p >= 0xc0
  const base = list ? 0xc0 : 0x80
  let len = p - base
  let start = at + 1
  if (len > 55) {
    const n = len - 55
    len = 0
    for (let i = 0; i < n; i++) len = len * 256 + b[at + 1 + i]!
    start += n
  }
  if (start + len > b.length) throw new RangeError('rlp: truncated')
  return { start, end: start + len, list }
}

/**
 * The 12 items of a type 2 transaction as serializeEip1559 and unsignedEip1559 write it (chain
 * id, nonce, the two fees, gas, to, value, data, access list, yParity, r, s), as views of `raw`.
 * Integers are minimal big-endian bytes, as RLP keeps them.
 */
export function eip1559Items(raw: Uint8Array): Uint8Array[] {
  if (raw[0] !== 0x02) throw new RangeError('not an EIP-1559 transaction')
  const list = item(raw, 1)
  if (!list.list || list.end !== raw.length) throw new RangeError('rlp: not one list')
  const parts: Uint8Array[] = []
  for (let at = list.start; at < list.end; ) {
    const it = item(raw, at)
    parts.push(raw.subarray(it.start, it.end))
    at = it.end
  }
  if (parts.length !== 12) throw new RangeError(`expected 12 items, got ${parts.length}`)
  return parts
}

/** Whether items of eip1559Items carry a signature (an unsigned transaction has zero r and s). */
export const signedItems = (parts: readonly Uint8Array[]): boolean => parts[10]!.length > 0 || parts[11]!.length > 0
