import t, { type Test } from 'tap'
import { rmSync } from 'node:fs'
import type { Hex } from 'viem'
import type { LedgerEntry, LedgerReceipt, LedgerWriter } from '../../src/chain/ledger-tx.js'
import { keccak256 } from '../../src/crypto/keccak.js'
import { Outbox } from '../../src/ledger/outbox.js'
import { Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import type { Logger } from '../../src/log/index.js'
import { Store } from '../../src/store/index.js'
import { tempDir } from '../helpers/gateway.js'

const ZERO: Hex = `0x${'0'.repeat(64)}`
const entry = (i: number): LedgerEntry => ({ id: keccak256(`r${i}`, 'utf8'), parentTxHash: ZERO, agentId: 'a', amount: 1n, protocol: 'x402', origin: 'http://m', pathHash: ZERO, depth: 0 })
const hashOf = (nonce: bigint): Hex => keccak256(`tx${nonce}`, 'utf8')

/** A chain that mines the outbox's records into the given blocks (by nonce), once `mined` is set. */
class FakeWriter {
  mined = false
  blockReceiptsSupported = true
  receiptCalls = 0
  blockCalls = 0
  readonly byHash = new Map<string, LedgerReceipt>()
  constructor(private readonly blockOf: (nonce: number) => number, private readonly reverted = new Set<number>()) {}
  async init(): Promise<bigint> {
    return 0n
  }
  sign(_e: LedgerEntry, nonce: bigint): { raw: Hex; hash: Hex } {
    const hash = hashOf(nonce)
    this.byHash.set(hash, { success: !this.reverted.has(Number(nonce)), blockNumber: this.blockOf(Number(nonce)) })
    return { raw: '0x02', hash }
  }
  async broadcast(): Promise<void> {}
  async receipt(hash: Hex): Promise<LedgerReceipt | null> {
    if (!this.mined) return null
    this.receiptCalls++
    return this.byHash.get(hash) ?? null
  }
  async blockReceipts(n: number): Promise<Map<string, LedgerReceipt> | null> {
    if (!this.blockReceiptsSupported) return null
    this.blockCalls++
    return new Map([...this.byHash].filter(([, r]) => r.blockNumber === n))
  }
}

const log = { warn() {}, error() {}, info() {}, debug() {} } as unknown as Logger

async function run(t: Test, writer: FakeWriter, count: number): Promise<TxRecord[]> {
  const dir = tempDir('paygate-outbox-')
  const store = await Store.open(dir)
  t.teardown(async () => {
    await outbox.close()
    await store.close()
    rmSync(dir, { recursive: true, force: true })
  })
  const transactions = new Transactions(store)
  const outbox = new Outbox(store, transactions, writer as unknown as LedgerWriter, log, 10)
  await outbox.start()
  const recs = Array.from({ length: count }, (_, i): TxRecord => ({
    id: `tx_${String(i).padStart(4, '0')}`, agentId: 'a', status: 'paid', createdAt: 0, updatedAt: 0, endpoint: 'http://m/p', method: 'GET',
    protocol: 'x402', amount: '1', txHash: null, parentTxHash: null, depth: 0,
  }))
  await Promise.all(recs.map((r, i) => outbox.record(entry(i), r.id, (hash) => transactions.ops({ ...r, txHash: hash, ledger: { status: 'queued' } }))))
  writer.mined = true
  t.ok(await outbox.drain(10_000), 'every record confirmed')
  return (await transactions.getMany(recs.map((r) => r.id))) as TxRecord[]
}

t.test('receipts of a shared block come in one call; records are confirmed with their blocks', async (t) => {
  // nonce 0 alone in block 5; 1-6 in block 6; 7-9 in block 7; nonce 4 reverted
  const writer = new FakeWriter((n) => (n === 0 ? 5 : n <= 6 ? 6 : 7), new Set([4]))
  const got = await run(t, writer, 10)
  t.same(
    got.map((r) => [r.ledger?.status, r.ledger?.blockNumber]),
    [[ 'confirmed', 5 ], ...[1, 2, 3].map(() => ['confirmed', 6]), ['failed', 6], ['confirmed', 6], ['confirmed', 6], ...[7, 8, 9].map(() => ['confirmed', 7])],
  )
  // block 5: one receipt; blocks 6 and 7: two receipts, then the block's receipts
  t.equal(writer.receiptCalls, 5)
  t.equal(writer.blockCalls, 2)
})

t.test('a node without eth_getBlockReceipts: one receipt per record, same outcome', async (t) => {
  const writer = new FakeWriter((n) => 10 + Math.floor(n / 4))
  writer.blockReceiptsSupported = false
  const got = await run(t, writer, 9)
  t.same(got.map((r) => r.ledger?.blockNumber), [10, 10, 10, 10, 11, 11, 11, 11, 12])
  t.ok(got.every((r) => r.ledger?.status === 'confirmed'))
  t.equal(writer.receiptCalls, 9)
})
