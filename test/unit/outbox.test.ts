import t, { type Test } from 'tap'
import { rmSync } from 'node:fs'
import type { Hex } from 'viem'
import type { LedgerWriter } from '../../src/chain/ledger-tx.js'
import { entry, FakeWriter, hashOf } from '../helpers/fake-ledger-writer.js'
import { Outbox } from '../../src/ledger/outbox.js'
import { Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import type { Logger } from '../../src/log/index.js'
import { Store } from '../../src/store/index.js'
import { tempDir, testDir } from '../helpers/gateway.js'
import { OffsetClock, type Clock } from '../../src/util/clock.js'

const log = { warn() {}, error() {}, info() {}, debug() {} } as unknown as Logger

const recordOf = (i: number): TxRecord => ({
  id: `tx_${String(i).padStart(4, '0')}`,
  agentId: 'a',
  status: 'paid',
  createdAt: 0,
  updatedAt: 0,
  endpoint: 'http://m/p',
  method: 'GET',
  protocol: 'x402',
  amount: '1',
  txHash: null,
  parentTxHash: null,
  depth: 0,
})

async function open(
  t: Test,
  writer: FakeWriter,
  dir = tempDir('paygate-outbox-'),
  maxHeld?: number,
  clock?: Clock,
): Promise<{ outbox: Outbox; store: Store; transactions: Transactions; dir: string }> {
  const store = await Store.open(dir)
  const transactions = new Transactions(store)
  const outbox = new Outbox(store, transactions, writer as unknown as LedgerWriter, log, { pollMs: 10, ...(maxHeld !== undefined ? { maxHeld } : {}), ...(clock ? { clock } : {}) })
  t.teardown(async () => {
    await outbox.close()
    await store.close()
  })
  await outbox.start()
  return { outbox, store, transactions, dir }
}

async function record(o: { outbox: Outbox; transactions: Transactions }, from: number, count: number): Promise<TxRecord[]> {
  const recs = Array.from({ length: count }, (_, i) => recordOf(from + i))
  await Promise.all(recs.map((r, i) => o.outbox.record(entry(from + i), r.id, (hash) => o.transactions.ops({ ...r, txHash: hash, ledger: { status: 'queued' } }))))
  return recs
}

async function run(t: Test, writer: FakeWriter, count: number): Promise<TxRecord[]> {
  const o = await open(t, writer)
  t.teardown(() => rmSync(o.dir, { recursive: true, force: true }))
  const recs = await record(o, 0, count)
  writer.mined = true
  t.ok(await o.outbox.drain(10_000), 'every record confirmed')
  return (await o.transactions.getMany(recs.map((r) => r.id))) as TxRecord[]
}

t.test("receipts of a shared block come in one call, and then the next block's first; records are confirmed with their blocks", async (t) => {
  // nonce 0 alone in block 5; 1-6 in block 6; 7-9 in block 7; nonce 4 reverted
  const writer = new FakeWriter((n) => (n === 0 ? 5 : n <= 6 ? 6 : 7), new Set([4]))
  const got = await run(t, writer, 10)
  t.same(
    got.map((r) => [r.ledger?.status, r.ledger?.blockNumber]),
    [['confirmed', 5], ...[1, 2, 3].map(() => ['confirmed', 6]), ['failed', 6], ['confirmed', 6], ['confirmed', 6], ...[7, 8, 9].map(() => ['confirmed', 7])],
  )
  // block 5: one receipt; block 6: two receipts, then the block's receipts; block 7 (records
  // come several to a block by then): the next block's receipts, one call
  t.equal(writer.receiptCalls, 3)
  t.equal(writer.blockCalls, 2)
})

t.test('records one to a block (a busy external chain): one receipt each, no block read whole', async (t) => {
  const writer = new FakeWriter((n) => 100 + 3 * n)
  const got = await run(t, writer, 6)
  t.same(
    got.map((r) => r.ledger?.blockNumber),
    [100, 103, 106, 109, 112, 115],
  )
  t.equal(writer.receiptCalls, 6)
  t.equal(writer.blockCalls, 0)
})

t.test('a node without eth_getBlockReceipts: one receipt per record, same outcome', async (t) => {
  const writer = new FakeWriter((n) => 10 + Math.floor(n / 4))
  writer.blockReceiptsSupported = false
  const got = await run(t, writer, 9)
  t.same(
    got.map((r) => r.ledger?.blockNumber),
    [10, 10, 10, 10, 11, 11, 11, 11, 12],
  )
  t.ok(got.every((r) => r.ledger?.status === 'confirmed'))
  t.equal(writer.receiptCalls, 9)
})

t.test("a backlog in blocks the node no longer keeps whole: one receipt per record, the block's receipts asked once", async (t) => {
  // 4 records a block from block 20; the node gives whole blocks from 23 on only (a restart
  // confirming what was mined long before)
  const writer = new FakeWriter((n) => 20 + Math.floor(n / 4))
  writer.keepsBlocksFrom = 23
  const got = await run(t, writer, 12)
  t.same(
    got.map((r) => [r.ledger?.status, r.ledger?.blockNumber]),
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11].map((i) => ['confirmed', 20 + Math.floor(i / 4)]),
  )
  t.equal(writer.receiptCalls, 12)
  t.equal(writer.blockCalls, 1, 'an empty answer for a block known to hold a record stops the block reads')
})

t.test('a pass sends every waiting record in one call, in nonce order; what the node refused is sent again', async (t) => {
  const writer = new FakeWriter(() => 3)
  const o = await open(t, writer)
  t.teardown(() => rmSync(o.dir, { recursive: true, force: true }))
  writer.refuseAfter = 4
  await record(o, 0, 10)
  writer.mined = true
  t.ok(await o.outbox.drain(10_000), 'every record confirmed')
  t.same(writer.broadcasts, [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    [4, 5, 6, 7, 8, 9],
  ])
  t.equal(o.outbox.pending(), 0)
  t.same(
    [...(await o.transactions.getMany(['tx_0000', 'tx_0009']))].map((r) => r?.ledger?.status),
    ['confirmed', 'confirmed'],
  )
})

t.test('records stored before a restart are sent again and confirmed after it', async (t) => {
  const dir = testDir(t, 'paygate-outbox-')
  const writer = new FakeWriter(() => 9)
  const first = await open(t, writer, dir)
  await record(first, 0, 5)
  await new Promise((r) => setTimeout(r, 100))
  t.equal(first.outbox.pending(), 5, 'sent, not yet mined')
  await first.outbox.close()
  await first.store.close()

  const again = new FakeWriter(() => 9)
  for (const [h, r] of writer.byHash) again.byHash.set(h, r) // the chain got them before the restart
  const second = await open(t, again, dir)
  t.equal(second.outbox.pending(), 5, 'read back at start')
  again.mined = true
  t.ok(await second.outbox.drain(10_000), 'every record confirmed')
  t.same(again.broadcasts[0], [0, 1, 2, 3, 4], 'every stored record sent again')
  const got = await second.transactions.getMany([0, 1, 2, 3, 4].map((i) => recordOf(i).id))
  t.ok(got.every((r) => r?.ledger?.status === 'confirmed' && r.ledger.blockNumber === 9))
})

t.test('a backlog longer than what is held in memory waits in the store and goes out in nonce order, also after a restart', async (t) => {
  const dir = testDir(t, 'paygate-outbox-')
  // mined only once `mined` is set: nothing held is confirmed, so no room is freed
  const writer = new FakeWriter((n) => 100 + n)
  const first = await open(t, writer, dir, 5)
  await record(first, 0, 8)
  await record(first, 8, 4)
  await new Promise((r) => setTimeout(r, 100))
  t.equal(first.outbox.pending(), 12)
  t.same(writer.broadcasts.flat(), [0, 1, 2, 3, 4], 'only what is held was sent')
  writer.mined = true
  t.ok(await first.outbox.drain(10_000), 'every record confirmed')
  t.same(writer.broadcasts.flat(), [...Array(12).keys()], 'each record sent once, in nonce order')

  await record(first, 12, 9)
  await first.outbox.close()
  await first.store.close()
  const again = new FakeWriter((n) => 100 + n)
  for (const [h, r] of writer.byHash) again.byHash.set(h, r)
  const second = await open(t, again, dir, 5)
  t.equal(second.outbox.pending(), 9, 'the whole backlog counted at start')
  again.mined = true
  t.ok(await second.outbox.drain(10_000), 'every record confirmed')
  t.same(again.broadcasts.flat(), [12, 13, 14, 15, 16, 17, 18, 19, 20])
  const got = await second.transactions.getMany([...Array(21).keys()].map((i) => recordOf(i).id))
  t.ok(got.every((r, i) => r?.ledger?.status === 'confirmed' && r.ledger.blockNumber === 100 + i))
})

t.test('a record the node dropped (no receipt long after it was sent) is sent again with those after it, while running; fees are refreshed each pass', async (t) => {
  const writer = new FakeWriter(() => 4)
  const clock = new OffsetClock()
  const o = await open(t, writer, undefined, undefined, clock)
  t.teardown(() => rmSync(o.dir, { recursive: true, force: true }))
  await record(o, 0, 3)
  const end = Date.now() + 5_000
  while (writer.broadcasts.length < 1 && Date.now() < end) await new Promise((r) => setTimeout(r, 20))
  await new Promise((r) => setTimeout(r, 100))
  t.equal(writer.broadcasts.length, 1, 'no resend while the wait for a receipt is short')
  t.ok(o.outbox.oldestWaitMs()! < 5_000, 'the oldest record has just been sent')
  clock.offset += 60_000 // a minute without a receipt
  while (writer.broadcasts.length < 2 && Date.now() < end) await new Promise((r) => setTimeout(r, 20))
  t.ok(o.outbox.oldestWaitMs()! >= 60_000, 'a resend does not restart the wait')
  t.same(
    writer.broadcasts.slice(0, 2),
    [
      [0, 1, 2],
      [0, 1, 2],
    ],
    'no receipt after the wait: the same records again, in nonce order',
  )
  writer.mined = true
  t.ok(await o.outbox.drain(5_000), 'then confirmed')
  t.equal(o.outbox.oldestWaitMs(), null, 'nothing waits')
  t.ok(writer.feeRefreshes >= 2, 'each pass asks for fees (the writer refreshes them when due)')
})

t.test('a record signed ahead is stored with that signature when it gets the nonce it was signed for; a guess that no longer holds is signed again', async (t) => {
  const writer = new FakeWriter(() => 3)
  const o = await open(t, writer)
  t.teardown(() => rmSync(o.dir, { recursive: true, force: true }))
  const tick = (): Promise<void> => new Promise((r) => setImmediate(r))
  const put = (i: number, e = entry(i)): Promise<Hex> => {
    const r = recordOf(i)
    return o.outbox.record(e, r.id, (hash) => o.transactions.ops({ ...r, txHash: hash, ledger: { status: 'queued' } }))
  }

  // Signed ahead with nonce 0, then recorded: no second signature, and the hash of nonce 0.
  o.outbox.signAhead(entry(0))
  await tick()
  t.same(writer.signs, [[entry(0).id, 0]], 'signed ahead, once')
  t.equal(await put(0), hashOf(0n))
  t.same(writer.signs, [[entry(0).id, 0]], 'recorded with the signature made ahead')

  // Signed ahead for nonce 1, but another record is stored first and takes nonce 1.
  o.outbox.signAhead(entry(1))
  await tick()
  t.equal(await put(2), hashOf(1n), 'the other record gets nonce 1, signed for itself')
  t.equal(await put(1), hashOf(2n), 'the record signed ahead gets nonce 2 and is signed again')
  t.same(writer.signs.slice(1), [
    [entry(1).id, 1],
    [entry(2).id, 1],
    [entry(1).id, 2],
  ])

  // The fees changed after the signature ahead: signed again under the new ones.
  o.outbox.signAhead(entry(3))
  await tick()
  writer.fees = 'f2'
  t.equal(await put(3), hashOf(3n))
  t.same(
    writer.signs.slice(4),
    [
      [entry(3).id, 3],
      [entry(3).id, 3],
    ],
    'signed ahead, then again under the new fees',
  )

  // Nothing is signed ahead while a record waits to be stored: its nonce is not settled yet.
  const waiting = put(4)
  o.outbox.signAhead(entry(5))
  await waiting
  await tick()
  t.same(writer.signs.slice(6), [[entry(4).id, 4]], 'only the waiting record was signed')

  // Recorded before the turn its signature ahead waited for (the retry's answer came first):
  // signed once, at once, not as a group request; the turn then signs nothing.
  const groups = writer.groups.length
  const e6 = entry(6) // the same entry, as the deliver stage passes it
  o.outbox.signAhead(e6)
  t.equal(await put(6, e6), hashOf(5n))
  await tick()
  t.same(writer.signs.slice(7), [[entry(6).id, 5]], 'signed once')
  t.equal(writer.groups.length, groups, 'no group request')

  writer.mined = true
  t.ok(await o.outbox.drain(10_000), 'every record confirmed')
  t.same(
    writer.broadcasts.flat().sort((a, b) => a - b),
    [0, 1, 2, 3, 4, 5],
    'consecutive nonces, each sent',
  )
})

t.test("a record whose nonce another transaction took is recorded again under the next nonce, its payment's record taking the new hash", async (t) => {
  const writer = new FakeWriter(() => 5)
  writer.taken.add(1)
  const clock = new OffsetClock()
  const o = await open(t, writer, undefined, undefined, clock)
  t.teardown(() => rmSync(o.dir, { recursive: true, force: true }))
  const recs = await record(o, 0, 3)
  writer.mined = true
  t.notOk(await o.outbox.drain(300), 'before the resend interval: the record stays unconfirmed, and the one behind it too')
  t.equal(o.outbox.pending(), 2)
  clock.offset += 60_000
  t.ok(await o.outbox.drain(5_000), 'after it: every record confirmed')
  const [r0, r1, r2] = (await o.transactions.getMany(recs.map((r) => r.id))) as TxRecord[]
  t.match(r1, { txHash: hashOf(3n), ledger: { status: 'confirmed', replacedTxHash: hashOf(1n) } }, 'recorded again at the next nonce, naming the hash it replaced')
  t.match(r0, { txHash: hashOf(0n), ledger: { status: 'confirmed' } })
  t.match(r2, { txHash: hashOf(2n), ledger: { status: 'confirmed' } }, 'the record behind it confirmed under its own hash')
  t.notOk(r2!.ledger!.replacedTxHash)
  t.same(
    writer.signs.filter(([id]) => id === entry(1).id).map(([, n]) => n),
    [1, 3],
    "the same entry, signed again once, at the signer's next nonce",
  )
  t.same(writer.broadcasts.at(-1), [3], 'the new one sent')
  t.equal(o.outbox.pending(), 0, 'no row left in the store')
})
