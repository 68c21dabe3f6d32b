import { encodeFunctionData, prepareEncodeFunctionData, type Hex } from 'viem'
import { keccak256 } from '../crypto/keccak.js'
import type { Chain } from './chain.js'
import { paymentLedgerAbi } from './contracts/abis.js'

export interface LedgerEntry {
  /** bytes32 record id (keccak of the local transaction id). */
  id: Hex
  /** Ledger tx hash of the parent record, or zero. */
  parentTxHash: Hex
  agentId: string
  amount: bigint
  protocol: string
  /** scheme://host[:port] only; the path travels as `pathHash`, the query never. */
  origin: string
  pathHash: Hex
  depth: number
}

export const ZERO32: Hex = `0x${'0'.repeat(64)}`
const GAS_LIMIT = 300_000n
/** record()'s ABI item and selector, resolved once (viem would hash the signature on every call). */
const RECORD = prepareEncodeFunctionData({ abi: paymentLedgerAbi, functionName: 'record' })

/** Split a URL into what the ledger may hold: the bare origin and the keccak of the path. */
export function ledgerLocation(url: string): { origin: string; pathHash: Hex } {
  const u = new URL(url)
  return { origin: u.origin, pathHash: keccak256(u.pathname, 'utf8') }
}

export const recordIdOf = (txId: string): Hex => keccak256(txId, 'utf8')

/**
 * Signs PaymentLedger.record() transactions with the service signer and a caller-managed
 * nonce, so the transaction hash is known (and stored) before anything is sent.
 */
export class LedgerWriter {
  private fees: { maxFeePerGas: bigint; maxPriorityFeePerGas: bigint } = { maxFeePerGas: 0n, maxPriorityFeePerGas: 0n }

  constructor(private readonly chain: Chain) {}

  /** The signer's next nonce by the chain's count (pending included), and a fee estimate. */
  async init(): Promise<bigint> {
    await this.refreshFees()
    return BigInt(await this.chain.publicClient.getTransactionCount({ address: this.chain.signer.address, blockTag: 'pending' }))
  }

  async refreshFees(): Promise<void> {
    if (this.chain.embedded) {
      this.fees = { maxFeePerGas: 50_000_000_000n, maxPriorityFeePerGas: 1n }
      return
    }
    const est = await this.chain.publicClient.estimateFeesPerGas()
    this.fees = { maxFeePerGas: est.maxFeePerGas * 2n, maxPriorityFeePerGas: est.maxPriorityFeePerGas }
  }

  sign(e: LedgerEntry, nonce: bigint): { raw: Hex; hash: Hex } {
    const data = encodeFunctionData({
      ...RECORD,
      args: [e.id, e.parentTxHash, e.agentId, e.amount, e.protocol, e.origin, e.pathHash, e.depth],
    })
    const raw = this.chain.fastSigner.signTransaction({
      type: 'eip1559',
      chainId: this.chain.info.chainId,
      to: this.chain.info.ledger,
      data,
      nonce: Number(nonce),
      gas: GAS_LIMIT,
      ...this.fees,
    })
    return { raw, hash: keccak256(raw) }
  }

  /** Broadcast; a node that already has it (re-send after restart) is not an error. */
  async broadcast(raw: Hex): Promise<void> {
    try {
      await this.chain.publicClient.request({ method: 'eth_sendRawTransaction', params: [raw] })
    } catch (e) {
      const msg = String((e as Error).message ?? e).toLowerCase()
      if (msg.includes('already known') || msg.includes('nonce too low') || msg.includes('already imported')) return
      throw e
    }
  }

  async receipt(hash: Hex): Promise<{ success: boolean; blockNumber: number } | null> {
    const r = (await this.chain.publicClient.request({ method: 'eth_getTransactionReceipt', params: [hash] })) as {
      status: Hex
      blockNumber: Hex
    } | null
    return r ? { success: r.status === '0x1', blockNumber: Number(r.blockNumber) } : null
  }
}
