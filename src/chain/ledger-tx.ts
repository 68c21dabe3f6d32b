import type { Hex } from 'viem'
import { keccak256 } from '../crypto/keccak.js'
import type { Chain } from './chain.js'
import { Lru } from '../util/lru.js'
import type { Logger } from '../log/index.js'
import { entryOfLedgerTx } from './ledger-decode.js'
import { LedgerSignThread } from './ledger-sign-thread.js'
import { LedgerSigner, type LedgerSignContext, type LedgerTx } from './ledger-signer.js'

export type { LedgerSignContext, LedgerTx }

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

export interface LedgerReceipt {
  success: boolean
  blockNumber: number
}

export const ZERO32: Hex = `0x${'0'.repeat(64)}`
/** Agents pay the same few endpoints over and over: the URL parse and path hash are kept per URL. */
const locations = new Lru<string, Readonly<{ origin: string; pathHash: Hex }>>(1024)

/** Split a URL into what the ledger may hold: the bare origin and the keccak of the path. */
export function ledgerLocation(url: string): Readonly<{ origin: string; pathHash: Hex }> {
  let loc = locations.get(url)
  if (!loc) {
    const u = new URL(url)
    loc = Object.freeze({ origin: u.origin, pathHash: keccak256(u.pathname, 'utf8') })
    locations.set(url, loc)
  }
  return loc
}

/** How often an external chain's fees are asked again for records signed from then on. */
const FEE_REFRESH_MS = 60_000

export const recordIdOf = (txId: string): Hex => keccak256(txId, 'utf8')

/**
 * Makes PaymentLedger.record() transactions from the service signer's account with a
 * caller-managed nonce, so the transaction hash is known (and stored) before anything is sent.
 * On an external chain they are signed; the embedded chain takes them unsigned, from the
 * account impersonated (`Chain.unsignedLedger`, docs/devnet.md).
 */
export class LedgerWriter {
  private fees: { maxFeePerGas: bigint; maxPriorityFeePerGas: bigint } = { maxFeePerGas: 0n, maxPriorityFeePerGas: 0n }
  private feesAt = 0
  private blockReceiptsWork = true
  private readonly signer: LedgerSigner
  private thread: LedgerSignThread | undefined
  private readonly log: Logger | undefined
  /** Records go unsigned (the embedded chain: `Chain.unsignedLedger`). */
  private readonly unsigned: boolean

  /**
   * `thread`: sign on a thread of its own (off by default: tests and tools sign in place).
   * Unsigned records are made in place all the same: an RLP and two keccaks (~0.02 ms) cost the
   * main thread less than a round trip to the thread does (docs/benchmarks.md).
   */
  constructor(
    private readonly chain: Chain,
    opts: { thread?: boolean; log?: Logger } = {},
  ) {
    this.signer = new LedgerSigner(chain.fastSigner)
    this.log = opts.log
    this.unsigned = chain.unsignedLedger
    if (opts.thread && !this.unsigned) this.thread = new LedgerSignThread(chain.fastSigner)
  }

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
    this.feesAt = Date.now()
  }

  /**
   * On an external chain, fees for records signed from now on follow the chain (every
   * FEE_REFRESH_MS): a record signed below what the chain has come to ask waits, with every
   * record after it, until fees come down; a signed record's fee cannot change (its hash would).
   */
  async refreshFeesIfDue(): Promise<void> {
    if (this.chain.embedded || Date.now() - this.feesAt < FEE_REFRESH_MS) return
    // Due again in a minute also when this fails: the last fees stay, and each pass does not wait on a failing node.
    this.feesAt = Date.now()
    await this.refreshFees()
  }

  /**
   * What a signature depends on besides the entry and the nonce (chain, ledger address, fees):
   * a record signed under another stamp must be signed again.
   */
  stamp(): string {
    return `${this.unsigned ? 'unsigned:' : ''}${this.chain.info.chainId}:${this.chain.info.ledger}:${this.fees.maxFeePerGas}:${this.fees.maxPriorityFeePerGas}`
  }

  /** What a record is signed under now: the chain, the ledger and the fees. */
  context(): LedgerSignContext {
    return { chainId: this.chain.info.chainId, ledger: this.chain.info.ledger, ...this.fees, ...(this.unsigned ? { unsigned: true } : {}) }
  }

  /** Sign (or make unsigned: `context()`) on this thread. */
  sign(e: LedgerEntry, nonce: bigint): LedgerTx {
    return this.signer.sign(this.context(), e, nonce)
  }

  /**
   * Sign records under the fees of now, on the signing thread (see ledger-sign-thread.ts); on
   * this thread if that thread cannot be had.
   */
  signMany(items: readonly { entry: LedgerEntry; nonce: bigint }[]): Promise<LedgerTx[]> {
    const ctx = this.context()
    const thread = this.thread
    if (thread?.alive) {
      return thread.sign(ctx, items).catch((e: unknown) => {
        if (thread.alive) throw e // the records could not be signed (the thread is fine)
        if (this.thread === thread) this.log?.warn({ err: e }, 'the ledger signing thread stopped; signing on the main thread from now on')
        this.thread = undefined
        return items.map((i) => this.signer.sign(ctx, i.entry, i.nonce))
      })
    }
    try {
      return Promise.resolve(items.map((i) => this.signer.sign(ctx, i.entry, i.nonce)))
    } catch (e) {
      return Promise.reject(e)
    }
  }

  /** Stop the signing thread (signing goes on, on this thread). */
  async close(): Promise<void> {
    const t = this.thread
    this.thread = undefined
    await t?.close()
  }

  /**
   * Broadcast records in nonce order; a node that already has one (a re-send after a restart)
   * is not an error. Resolves how many of `raws`, from the first, the node now holds; the
   * error of the first one it refused, if any, comes with it.
   */
  async broadcast(raws: Hex[]): Promise<{ sent: number; error?: Error }> {
    const rs = await this.chain.sendLedger(raws)
    for (let i = 0; i < rs.length; i++) {
      const r = rs[i]!
      if ('hash' in r) continue
      const msg = r.error.message.toLowerCase()
      if (msg.includes('already known') || msg.includes('nonce too low') || msg.includes('already imported')) continue
      return { sent: i, error: Object.assign(new Error(`ledger record not accepted: ${r.error.message}`), { code: r.error.code }) }
    }
    return { sent: raws.length }
  }

  /**
   * Whether another transaction took a sent record's nonce: the chain counts a transaction from
   * the signer at that nonce mined, and it is not this record (no receipt, read after the count).
   * Such a record can never be mined (Outbox.replace records it again).
   */
  async nonceTaken(nonce: bigint, hash: Hex): Promise<boolean> {
    const mined = await this.chain.publicClient.getTransactionCount({ address: this.chain.signer.address, blockTag: 'latest' })
    return BigInt(mined) > nonce && (await this.receipt(hash)) === null
  }

  /** The entry a stored record's transaction records (to record it again under another nonce). */
  entryOf(raw: Hex): LedgerEntry {
    return entryOfLedgerTx(raw)
  }

  async receipt(hash: Hex): Promise<LedgerReceipt | null> {
    const r = (await this.chain.publicClient.request({ method: 'eth_getTransactionReceipt', params: [hash] })) as {
      status: Hex
      blockNumber: Hex
    } | null
    return r ? { success: r.status === '0x1', blockNumber: Number(r.blockNumber) } : null
  }

  /**
   * Every receipt of a mined block, by lower-case tx hash: under load one block holds
   * hundreds of ledger records, and one call replaces a call per record. Null when the
   * node cannot answer it (the method is not universal): callers ask per transaction, and
   * after a failure this is not tried again.
   */
  async blockReceipts(blockNumber: number): Promise<Map<string, LedgerReceipt> | null> {
    if (!this.blockReceiptsWork) return null
    try {
      const rs = (await this.chain.publicClient.request({ method: 'eth_getBlockReceipts', params: [`0x${blockNumber.toString(16)}`] })) as
        | { transactionHash: Hex; status: Hex; blockNumber: Hex }[]
        | null
      if (!Array.isArray(rs)) return null
      return new Map(rs.map((r) => [r.transactionHash.toLowerCase(), { success: r.status === '0x1', blockNumber: Number(r.blockNumber) }]))
    } catch {
      this.blockReceiptsWork = false
      return null
    }
  }
}
