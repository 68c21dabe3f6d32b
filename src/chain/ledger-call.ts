/**
 * ABI calldata of PaymentLedger.record(), written directly: the paid path signs one per
 * payment, and viem's generic encoder (hex strings, per-parameter objects) cost more
 * than the signature. Same bytes as viem's `encodeFunctionData` (test/unit/ledger-tx.test.ts).
 */
import { keccak256Bytes } from '../crypto/keccak.js'
import { paymentLedgerAbi } from './contracts/abis.js'
import type { LedgerEntry } from './ledger-tx.js'
import { MAX_UINT256 } from '../util/money.js'

const BYTES32_RE = /^0x[0-9a-fA-F]{64}$/

/** Checked against the contract's ABI at load: a changed contract fails loudly instead of being recorded wrongly. */
const RECORD_SIGNATURE = 'record(bytes32,bytes32,string,uint256,string,string,bytes32,uint32)'
{
  const item = paymentLedgerAbi.find((i) => i.type === 'function' && i.name === 'record')
  const actual = item && 'inputs' in item ? `record(${item.inputs.map((i) => i.type).join(',')})` : 'none'
  if (actual !== RECORD_SIGNATURE) throw new Error(`PaymentLedger.record is ${actual}; ledger-call.ts encodes ${RECORD_SIGNATURE}`)
}
const RECORD_SELECTOR = keccak256Bytes(Buffer.from(RECORD_SIGNATURE, 'utf8')).subarray(0, 4)

const padded = (n: number): number => Math.ceil(n / 32) * 32

function writeBytes32(out: Buffer, at: number, v: string, field: string): void {
  if (!BYTES32_RE.test(v)) throw new RangeError(`${field} must be 32 bytes of hex`)
  out.write(v.slice(2), at, 32, 'hex')
}

/**
 * Calldata of `record(...)`: the 4-byte selector, eight head words (static values,
 * and for the three strings their offsets), then each string as a length word and its
 * UTF-8 bytes zero-padded to a word. Same bytes as viem's `encodeFunctionData`.
 */
export function encodeRecordCall(e: LedgerEntry): Buffer {
  if (e.amount < 0n || e.amount > MAX_UINT256) throw new RangeError(`amount out of uint256 range: ${e.amount}`)
  if (!Number.isInteger(e.depth) || e.depth < 0 || e.depth > 0xffffffff) throw new RangeError(`depth out of uint32 range: ${e.depth}`)
  const strings = [Buffer.from(e.agentId, 'utf8'), Buffer.from(e.protocol, 'utf8'), Buffer.from(e.origin, 'utf8')] as const
  const HEAD = 8 * 32
  let size = 4 + HEAD
  for (const b of strings) size += 32 + padded(b.length)
  const out = Buffer.alloc(size) // zero-filled: the padding
  RECORD_SELECTOR.copy(out, 0)
  const word = (i: number): number => 4 + 32 * i
  writeBytes32(out, word(0), e.id, 'id')
  writeBytes32(out, word(1), e.parentTxHash, 'parentTxHash')
  out.write(e.amount.toString(16).padStart(64, '0'), word(3), 32, 'hex')
  writeBytes32(out, word(6), e.pathHash, 'pathHash')
  out.writeUInt32BE(e.depth, word(7) + 28)
  // Dynamic values: offsets count from the start of the arguments (after the selector).
  let tail = HEAD
  for (const [slot, b] of [
    [2, strings[0]],
    [4, strings[1]],
    [5, strings[2]],
  ] as const) {
    out.writeUInt32BE(tail, word(slot) + 28)
    out.writeUInt32BE(b.length, 4 + tail + 28)
    b.copy(out, 4 + tail + 32)
    tail += 32 + padded(b.length)
  }
  return out
}
