import { decodeFunctionData, type Hex } from 'viem'
import { paymentLedgerAbi } from './contracts/abis.js'
import { eip1559Items } from './eip1559.js'
import type { LedgerEntry } from './ledger-tx.js'

/**
 * The entry a stored ledger transaction (signed or unsigned, `raw`) records: to record it again
 * under another nonce (Outbox.replace). Off the paid path, so viem's decoder is used; kept out of
 * ledger-call.ts, which the ledger signing thread loads, so that thread does not load viem.
 */
export function entryOfLedgerTx(raw: Hex): LedgerEntry {
  const data = eip1559Items(Buffer.from(raw.slice(2), 'hex'))[7]!
  const { functionName, args } = decodeFunctionData({ abi: paymentLedgerAbi, data: `0x${Buffer.from(data).toString('hex')}` })
  if (functionName !== 'record') throw new RangeError(`not a ledger record: ${functionName}`)
  const [id, parentTxHash, agentId, amount, protocol, origin, pathHash, depth] = args as readonly [Hex, Hex, string, bigint, string, string, Hex, number]
  return { id, parentTxHash, agentId, amount, protocol, origin, pathHash, depth }
}
