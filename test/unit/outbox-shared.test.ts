import t from 'tap'
import type { LedgerWriter } from '../../src/chain/ledger-tx.js'
import { Outbox } from '../../src/ledger/outbox.js'
import { Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import type { Logger } from '../../src/log/index.js'
import { Store } from '../../src/store/index.js'
import { OffsetClock } from '../../src/util/clock.js'
import { entry, FakeWriter, hashOf } from '../helpers/fake-ledger-writer.js'
import { testDir, testStore } from '../helpers/gateway.js'

/**
 * Replicas on one PostgreSQL database, one ledger signer: a record whose nonce another
 * transaction took is held by every replica that sends it (a replica started meanwhile holds
 * every stored row). Each finds it stuck; one records it again, the others find its row gone
 * under the signer's lock and drop it: the payment is recorded on chain once more, not once per replica.
 */
const log = { warn() {}, error() {}, info() {}, debug() {} } as unknown as Logger

t.test('a taken nonce held by two replicas: recorded again once', async (t) => {
  const writer = new FakeWriter(() => 5)
  writer.taken.add(1)
  const clock = new OffsetClock()
  const { store: a, url } = await testStore(t, undefined, 'postgres')
  const b = await Store.open(testDir(t), { postgresUrl: url! })
  t.teardown(() => b.close())
  const open = async (store: Store) => {
    const transactions = new Transactions(store)
    const outbox = new Outbox(store, transactions, writer as unknown as LedgerWriter, log, { pollMs: 10, clock })
    t.teardown(() => outbox.close())
    await outbox.start()
    return { outbox, transactions }
  }
  const ra = await open(a)
  const recs = Array.from(
    { length: 3 },
    (_, i): TxRecord => ({
      ...{ id: `tx_${i}`, agentId: 'a', status: 'paid', createdAt: 0, updatedAt: 0, endpoint: 'http://m/p', method: 'GET' },
      ...{ protocol: 'x402', amount: '1', txHash: null, parentTxHash: null, depth: 0 },
    }),
  )
  await Promise.all(recs.map((r, i) => ra.outbox.record(entry(i), r.id, (hash) => ra.transactions.ops({ ...r, txHash: hash, ledger: { status: 'queued' } }))))
  const rb = await open(b) // holds every stored row, as a replica started after a restart does
  t.equal(rb.outbox.pending(), 3, 'the second replica holds the three rows')
  writer.mined = true
  t.notOk(await ra.outbox.drain(300), 'before the resend interval the taken record waits')
  clock.offset += 60_000
  t.ok(await ra.outbox.drain(5_000), 'then the first replica has nothing left')
  t.ok(await rb.outbox.drain(5_000), 'nor the second')
  t.same(
    writer.signs.filter(([id]) => id === entry(1).id).map(([, n]) => n),
    [1, 3],
    'the taken record was signed again once, at the next nonce',
  )
  const r1 = (await ra.transactions.get('tx_1'))!
  t.match(r1, { txHash: hashOf(3n), ledger: { status: 'confirmed', replacedTxHash: hashOf(1n) } })
  t.match(await ra.transactions.get('tx_2'), { txHash: hashOf(2n), ledger: { status: 'confirmed' } })
})
