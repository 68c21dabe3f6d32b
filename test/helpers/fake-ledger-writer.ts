import type { Hex } from 'viem'
import type { LedgerEntry, LedgerReceipt } from '../../src/chain/ledger-tx.js'
import { keccak256 } from '../../src/crypto/keccak.js'

/* The outbox's chain side, by hand (test/unit/outbox*.test.ts): what is mined, taken, refused. */

const ZERO: Hex = `0x${'0'.repeat(64)}`
export const entry = (i: number): LedgerEntry => ({ id: keccak256(`r${i}`, 'utf8'), parentTxHash: ZERO, agentId: 'a', amount: 1n, protocol: 'x402', origin: 'http://m', pathHash: ZERO, depth: 0 })
export const hashOf = (nonce: bigint): Hex => keccak256(`tx${nonce}`, 'utf8')

/** A chain that mines the outbox's records into the given blocks (by nonce), once `mined` is set. */
export class FakeWriter {
  mined = false
  blockReceiptsSupported = true
  receiptCalls = 0
  blockCalls = 0
  readonly byHash = new Map<string, LedgerReceipt>()
  constructor(
    private readonly blockOf: (nonce: number) => number,
    private readonly reverted = new Set<number>(),
  ) {}
  async init(): Promise<bigint> {
    return 0n
  }
  feeRefreshes = 0
  async refreshFeesIfDue(): Promise<void> {
    this.feeRefreshes++
  }
  /** What the signatures depend on besides entry and nonce (the fees, on a real chain). */
  fees = 'f1'
  stamp(): string {
    return this.fees
  }
  /** Every signature made: [entry id, nonce]. */
  readonly signs: [Hex, number][] = []
  /** The size of each group request (`signMany`). */
  readonly groups: number[] = []
  sign(e: LedgerEntry, nonce: bigint): { raw: Hex; hash: Hex } {
    this.signs.push([e.id, Number(nonce)])
    const hash = hashOf(nonce)
    if (!this.taken.has(Number(nonce))) this.byHash.set(hash, { success: !this.reverted.has(Number(nonce)), blockNumber: this.blockOf(Number(nonce)) })
    const raw: Hex = `0x${nonce.toString(16).padStart(4, '0')}`
    this.entries.set(raw, e)
    return { raw, hash }
  }
  /** Nonces another transaction took: their records never get a receipt. */
  readonly taken = new Set<number>()
  /** What each raw transaction records (the chain's calldata). */
  readonly entries = new Map<Hex, LedgerEntry>()
  async nonceTaken(nonce: bigint, hash: Hex): Promise<boolean> {
    return this.mined && this.taken.has(Number(nonce)) && !this.byHash.has(hash)
  }
  entryOf(raw: Hex): LedgerEntry {
    const e = this.entries.get(raw)
    if (!e) throw new Error(`no transaction ${raw}`)
    return e
  }
  /** Signing requests (as LedgerWriter.signMany: asynchronous, one per group). */
  async signMany(items: readonly { entry: LedgerEntry; nonce: bigint }[]): Promise<{ raw: Hex; hash: Hex }[]> {
    this.groups.push(items.length)
    return items.map((i) => this.sign(i.entry, i.nonce))
  }
  async close(): Promise<void> {}
  /** The nonces of each broadcast call. */
  readonly broadcasts: number[][] = []
  /** The next broadcast: the node takes only this many, then refuses one. */
  refuseAfter: number | null = null
  async broadcast(raws: Hex[]): Promise<{ sent: number; error?: Error }> {
    this.broadcasts.push(raws.map((r) => Number.parseInt(r.slice(2), 16)))
    const refuse = this.refuseAfter
    this.refuseAfter = null
    return refuse === null ? { sent: raws.length } : { sent: refuse, error: new Error('replacement transaction underpriced') }
  }
  async receipt(hash: Hex): Promise<LedgerReceipt | null> {
    if (!this.mined) return null
    this.receiptCalls++
    return this.byHash.get(hash) ?? null
  }
  /** The oldest block whose receipts the node still gives whole (as anvil forgets old blocks: older ones come back empty). */
  keepsBlocksFrom = 0
  async blockReceipts(n: number): Promise<Map<string, LedgerReceipt> | null> {
    if (!this.blockReceiptsSupported) return null
    this.blockCalls++
    if (n < this.keepsBlocksFrom) return new Map()
    return new Map([...this.byHash].filter(([, r]) => r.blockNumber === n))
  }
}
