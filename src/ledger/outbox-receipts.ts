import type { Hex } from 'viem'
import type { LedgerReceipt, LedgerWriter } from '../chain/ledger-tx.js'

/** A stored ledger record: its nonce, the payment it records, the transaction and its hash. */
export interface OutboxEntry {
  nonce: string
  txId: string
  raw: Hex
  hash: Hex
}

/** The meta key of the next nonce to take, and each stored record's key (its nonce, so that keys sort in nonce order). */
export const NONCE_KEY = 'ledgerNextNonce'
export const nonceKey = (n: bigint): string => n.toString().padStart(20, '0')

/**
 * The unconfirmed records that have receipts, from the first on. Confirming stops at the first
 * record without a receipt (`left`): a pass costs what changed, not the whole backlog. Once two
 * records in a row share a block, the rest of that block's receipts come in one call; and
 * once records come several to a block, the next record is looked for in the next block's
 * receipts first (they are mined in nonce order): one call a block, not one a record.
 */
export async function minedInOrder(
  unconfirmed: readonly OutboxEntry[],
  writer: Pick<LedgerWriter, 'receipt' | 'blockReceipts'>,
): Promise<{ confirmed: { e: OutboxEntry; r: LedgerReceipt }[]; left: boolean }> {
  const confirmed: { e: OutboxEntry; r: LedgerReceipt }[] = []
  let fromBlock = new Map<string, LedgerReceipt>()
  let lastBlock = -1
  let dense = false
  // False once a block's receipts came back without a record known to be in it: the node no
  // longer keeps that block's receipts (a backlog confirmed after a restart), and asking for
  // the next blocks' would cost a call a record for nothing.
  let blocksKept = true
  for (const e of unconfirmed) {
    const h = e.hash.toLowerCase()
    let r = fromBlock.get(h)
    if (r) dense = true
    else if (dense) {
      fromBlock = (await writer.blockReceipts(lastBlock + 1)) ?? fromBlock
      r = fromBlock.get(h)
      if (r) lastBlock = r.blockNumber
    }
    if (!r) {
      const one = await writer.receipt(e.hash)
      if (!one) return { confirmed, left: true }
      if (blocksKept && one.blockNumber === lastBlock) {
        fromBlock = (await writer.blockReceipts(one.blockNumber)) ?? fromBlock
        blocksKept = fromBlock.has(h)
      }
      lastBlock = one.blockNumber
      r = one
    }
    confirmed.push({ e, r })
  }
  return { confirmed, left: false }
}
