/**
 * Checking ledger records against the chain (PaymentLedger version 2): a record's digest and
 * the running `head` the contract folds every digest into, computed here the way record()
 * does, and the PaymentRecorded event out of a receipt. Replaying the records in order from
 * bytes32(0) must give the contract's `head()`; one changed, missing or extra record does not.
 */
import { decodeEventLog, encodeAbiParameters, type Hex, keccak256, toHex } from 'viem'
import { paymentLedgerAbi } from './contracts/abis.js'
import type { LedgerEntry } from './ledger-tx.js'

export const ZERO_HEAD: Hex = `0x${'0'.repeat(64)}`

const DIGEST_TYPES = [
  { type: 'bytes32' },
  { type: 'bytes32' },
  { type: 'bytes32' },
  { type: 'uint256' },
  { type: 'bytes32' },
  { type: 'bytes32' },
  { type: 'bytes32' },
  { type: 'uint32' },
  { type: 'uint64' },
] as const

const hashText = (s: string): Hex => keccak256(toHex(s))

/** What record() folds into `head` for `e`, recorded in a block at `timestamp` (s). */
export function recordDigest(e: LedgerEntry, timestamp: bigint): Hex {
  return keccak256(encodeAbiParameters(DIGEST_TYPES, [e.id, e.parentTxHash, hashText(e.agentId), e.amount, hashText(e.protocol), hashText(e.origin), e.pathHash, e.depth, timestamp]))
}

/** The head after `previous` and one record of `digest`. */
export const nextHead = (previous: Hex, digest: Hex): Hex => keccak256(encodeAbiParameters([{ type: 'bytes32' }, { type: 'bytes32' }], [previous, digest]))

/** A PaymentRecorded event: the entry and the block timestamp it was recorded at. */
export interface RecordedEvent {
  entry: LedgerEntry
  timestamp: bigint
}

/** The PaymentRecorded events of `ledger` in a receipt's logs, in log order. */
export function recordedEvents(logs: ReadonlyArray<{ address: string; topics: readonly Hex[]; data: Hex }>, ledger: string): RecordedEvent[] {
  const out: RecordedEvent[] = []
  for (const l of logs) {
    if (l.address.toLowerCase() !== ledger.toLowerCase() || !l.topics.length) continue
    const ev = decodeEventLog({ abi: paymentLedgerAbi, data: l.data, topics: l.topics as [Hex, ...Hex[]], strict: false })
    if (ev.eventName !== 'PaymentRecorded') continue
    const a = ev.args
    out.push({
      entry: { id: a.id!, parentTxHash: a.parentTxHash!, agentId: a.agentId!, amount: a.amount!, protocol: a.protocol!, origin: a.origin!, pathHash: a.pathHash!, depth: a.depth! },
      timestamp: a.timestamp!,
    })
  }
  return out
}

/** The head after folding `events` (in ledger order) into `from`. */
export function headAfter(events: Iterable<RecordedEvent>, from: Hex = ZERO_HEAD): Hex {
  let h = from
  for (const e of events) h = nextHead(h, recordDigest(e.entry, e.timestamp))
  return h
}
