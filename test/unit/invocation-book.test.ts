import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import type { Test } from 'tap'
import type { TxRecord } from '../../src/ledger/transactions.js'
import { InvocationBook, newInvocationToken, tokenHash, type InvocationRecord, type SharedBook } from '../../src/policy/invocations.js'
import { Store, type BatchOp, type Txn } from '../../src/store/index.js'
import { testStore } from '../helpers/gateway.js'

/** The book of open invocations on a real store: tokens, caps under concurrency, settling, nested closes, what is stored. */
const rec = (id: string, cap: bigint, parentId: string | null, token: string, invokers: string[], topId = parentId ?? id): InvocationRecord => ({
  ...{ id, agentId: invokers[invokers.length - 1]!, status: 'open', createdAt: 1, tokenHash: tokenHash(token), rootTxId: `tx_root_${id}`, rootTxHash: `0x${id}`, topId },
  ...{ depth: parentId ? 1 : 0, parentId, invokers, agentEndpoint: 'http://127.0.0.1:1/', cap: cap.toString(), spent: '0', holds: {}, capHold: false, chain: [] },
})
const paid = (id: string, invId: string, hash: string) => ({ kind: 'paid', record: { id, status: 'paid', txHash: hash, invocation: { id: invId } } })
const failed = (id: string, invId: string) => ({ kind: 'finished', record: { id, status: 'failed', txHash: null, invocation: { id: invId } } })

/** Run `fn` in a transact() section of `key` (as the engine's payer or opener does) and write what it returns. */
async function inTx<T>(store: Store, key: string, fn: (tx: Txn) => Promise<T>): Promise<T> {
  const { result, written } = await store.transact(key, async (tx) => {
    const r = await fn(tx)
    return { ops: (r as { ops?: BatchOp[] }).ops ?? [], result: r }
  })
  const w = await written
  if (!w.ok) throw w.error
  return result
}

const hold = (store: Store, book: InvocationBook, agent: string, inv: string, txId: string, amount: bigint) =>
  inTx(store, `usage\u0000${agent}`, async (tx) => {
    const r = await book.holdPayment(tx, inv, txId, amount)
    return r.ok ? r : { ...r, ops: [] }
  })

t.test('tokens resolve while open; a closed one is budget_exceeded "invocation closed"', async (t) => {
  const { store } = await testStore(t)
  const book = new InvocationBook(store)
  const token = newInvocationToken()
  await store.batch(book.opened(rec('inv_a', 100n, null, token, ['o'])))
  t.equal((await book.resolve(token)).id, 'inv_a')
  await t.rejects(book.resolve(newInvocationToken()), { code: 'budget_exceeded', detail: /not one of an open invocation/ })
  const { closed } = await inTx(store, 'usage\u0000o', (tx) => book.close(tx, 'inv_a', 'closed', 5))
  t.match(closed[0], { id: 'inv_a', status: 'closed', closedAt: 5, pending: '0' })
  await t.rejects(book.resolve(token), { code: 'budget_exceeded', detail: /invocation closed/ })
  t.match(await book.get('inv_a'), { status: 'closed' }, 'stored')
})

t.test('concurrent holds never take more than the cap; settling moves holds to spent and builds the chain', async (t) => {
  const { store } = await testStore(t)
  const book = new InvocationBook(store)
  await store.batch(book.opened(rec('inv_b', 100n, null, newInvocationToken(), ['o'])))
  const taken = (await Promise.all(Array.from({ length: 15 }, (_, i) => hold(store, book, `a${i % 3}`, 'inv_b', `tx_${i}`, 10n)))).filter((x) => x.ok)
  t.equal(taken.length, 10, 'exactly 10 of 15 payments of 10 under a cap of 100')
  t.match(await book.fits('inv_b', 1n), { ok: false })
  book.contributor(paid('tx_0', 'inv_b', '0xh0'))
  book.contributor(failed('tx_1', 'inv_b'))
  book.contributor({ kind: 'finished', record: { id: 'tx_2', status: 'unknown', txHash: null, invocation: { id: 'inv_b' } } })
  const now = (await book.live('inv_b'))!
  t.same([now.spent, Object.keys(now.holds).length, now.chain], ['10', 8, ['0xh0']])
  t.ok((await book.fits('inv_b', 10n)).ok, 'the failed payment gave its room back')
  const { closed } = await inTx(store, 'usage\u0000o', (tx) => book.close(tx, 'inv_b', 'closed', 9))
  t.equal(closed[0]!.pending, '80', 'what is still open at the close is pending')
})

t.test('nesting: the carve, the close of the child into the parent, and a parent close that closes the child', async (t) => {
  const { store } = await testStore(t)
  const book = new InvocationBook(store)
  await store.batch(book.opened(rec('inv_p', 100n, null, newInvocationToken(), ['o'])))
  t.match(await inTx(store, 'usage\u0000s', async (tx) => ({ ...(await book.carve(tx, 'inv_p', 'inv_c', 101n)), ops: [] })), { ok: false })
  t.ok((await inTx(store, 'usage\u0000s', (tx) => book.carve(tx, 'inv_p', 'inv_c', 60n))).ok)
  await store.batch(book.opened(rec('inv_c', 60n, 'inv_p', newInvocationToken(), ['o', 's'])))
  t.notOk((await book.fits('inv_p', 41n)).ok, "the child's cap is held in the parent")
  await hold(store, book, 'x', 'inv_c', 'tx_c1', 20n)
  await hold(store, book, 'x', 'inv_c', 'tx_c2', 5n)
  book.contributor(paid('tx_c1', 'inv_c', '0xc1'))
  t.same((await book.live('inv_p'))!.chain, ['0xc1'], "a child's payment joins the open parent's chain")
  await inTx(store, 'usage\u0000s', (tx) => book.close(tx, 'inv_c', 'closed', 3))
  const p = (await book.live('inv_p'))!
  t.same([p.spent, p.holds], ['20', { tx_c2: '5' }], 'spent moved up, the unknown payment is held in the parent')
  book.contributor(paid('tx_c2', 'inv_c', '0xc2'))
  t.same((await book.live('inv_p'))!.spent, '25', 'and settles there')

  // A parent closed while a child is open closes the child too.
  await inTx(store, 'usage\u0000s', (tx) => book.carve(tx, 'inv_p', 'inv_d', 10n))
  const tokenD = newInvocationToken()
  await store.batch(book.opened(rec('inv_d', 10n, 'inv_p', tokenD, ['o', 's'])))
  const all = await inTx(store, 'usage\u0000o', (tx) => book.close(tx, 'inv_p', 'interrupted', 7))
  t.same(
    all.closed.map((c) => [c.id, c.status]),
    [
      ['inv_p', 'interrupted'],
      ['inv_d', 'interrupted'],
    ],
  )
  await t.rejects(book.resolve(tokenD), { code: 'budget_exceeded' })
})

t.test('left open by a previous run: found at start, adopted and closed', async (t) => {
  const { store, dir } = await testStore(t)
  const book = new InvocationBook(store)
  await store.batch(book.opened(rec('inv_z', 50n, null, newInvocationToken(), ['o'])))
  await store.close()
  const again = await Store.open(dir)
  t.teardown(() => again.close())
  const next = new InvocationBook(again)
  const left = await next.leftOpen()
  t.same(
    left.map((r) => r.id),
    ['inv_z'],
  )
  next.adopt(left[0]!)
  const { closed } = await inTx(again, 'usage\u0000o', (tx) => next.close(tx, 'inv_z', 'interrupted', 11))
  t.match(closed[0], { status: 'interrupted', closedAt: 11 })
})

/**
 * Shared by replicas: two stores on one PostgreSQL database stand for two replicas, each with
 * its own book and nothing in memory; the payment records the holds settle from are real rows.
 */
async function twoReplicas(t: Test) {
  const { store, url } = await testStore(t, undefined, 'postgres')
  const other = await Store.open('/nonexistent-unused', { postgresUrl: url! })
  t.teardown(() => other.close())
  const alive = new Set(['r1', 'r2'])
  const txs = store.collection<TxRecord>('tx')
  const shared = (owner: string, s: Store): SharedBook => ({ owner, payments: (ids) => s.collection<TxRecord>('tx').getMany(ids), alive: async (id) => alive.has(id) })
  const books = [new InvocationBook(store, shared('r1', store)), new InvocationBook(other, shared('r2', other))] as const
  const stores = [store, other] as const
  /** A payment record finished as `status` (what the engine writes). */
  const finish = (id: string, inv: string, status: string, txHash: string | null, updatedAt: number) => txs.put(id, { id, status, txHash, updatedAt, invocation: { id: inv } } as unknown as TxRecord)
  return { books, stores, alive, finish }
}

t.test('shared: concurrent holds on two replicas never take more than the cap; finished payments settle on the next read', async (t) => {
  const { books, stores, finish } = await twoReplicas(t)
  const token = newInvocationToken()
  await stores[0].batch(books[0].opened(rec('inv_s', 100n, null, token, ['o'])))
  t.equal((await books[1].resolve(token)).id, 'inv_s', 'a token opened on one replica pays on the other')
  const tries = await Promise.all(Array.from({ length: 30 }, (_, i) => hold(stores[i % 2]!, books[i % 2]!, `a${i % 5}`, 'inv_s', `tx_${String(i).padStart(2, '0')}`, 10n)))
  const taken = tries.flatMap((r, i) => (r.ok ? [`tx_${String(i).padStart(2, '0')}`] : []))
  t.equal(taken.length, 10, 'exactly 10 of 30 payments of 10 under a cap of 100, across both replicas')
  t.match(
    tries.find((r) => !r.ok),
    { ok: false, detail: /would exceed the invocation budget/ },
  )
  t.notOk((await books[1].fits('inv_s', 1n)).ok)

  await finish(taken[0]!, 'inv_s', 'paid', '0xp0', 10)
  await finish(taken[1]!, 'inv_s', 'failed', null, 11)
  await finish(taken[2]!, 'inv_s', 'unknown', null, 12)
  const seen = (await books[1].live('inv_s'))!
  t.same([seen.spent, Object.keys(seen.holds).length, seen.chain], ['10', 8, ['0xp0']], 'paid to spent, failed dropped, unknown still held')
  t.ok((await books[0].fits('inv_s', 10n)).ok, "the failed payment's room is back on the other replica")
  const more = await hold(stores[1], books[1], 'a9', 'inv_s', 'tx_99', 10n)
  t.ok(more.ok, 'and taken once')
  t.notOk((await hold(stores[0], books[0], 'a8', 'inv_s', 'tx_98', 10n)).ok, 'only once')

  await finish(taken[3]!, 'inv_s', 'paid', '0xp3', 13)
  const { closed } = await inTx(stores[0], 'usage\u0000o', (tx) => books[0].close(tx, 'inv_s', 'closed', 20))
  t.match(closed[0], { status: 'closed', spent: '20', chain: ['0xp0', '0xp3'], pending: '80' }, 'settled at the close; the rest pending')
  t.match(await books[1].get('inv_s'), { status: 'closed', spent: '20' }, 'stored for every replica')
  await t.rejects(books[1].resolve(token), { code: 'budget_exceeded', detail: /invocation closed/ })
})

t.test('shared: a child opened and paid through one replica closes into its parent held by the other', async (t) => {
  const { books, stores, finish } = await twoReplicas(t)
  await stores[0].batch(books[0].opened(rec('inv_P', 100n, null, newInvocationToken(), ['o'])))
  t.notOk((await inTx(stores[1], 'usage\u0000s', async (tx) => ({ ...(await books[1].carve(tx, 'inv_P', 'inv_C', 101n)), ops: [] }))).ok)
  t.ok((await inTx(stores[1], 'usage\u0000s', (tx) => books[1].carve(tx, 'inv_P', 'inv_C', 60n))).ok)
  await stores[1].batch(books[1].opened(rec('inv_C', 60n, 'inv_P', newInvocationToken(), ['o', 's'], 'inv_P')))
  t.notOk((await books[0].fits('inv_P', 41n)).ok, "the child's cap is held in the parent, seen by the other replica")
  t.ok((await hold(stores[1], books[1], 'x', 'inv_C', 'tx_c1', 20n)).ok)
  t.ok((await hold(stores[0], books[0], 'y', 'inv_C', 'tx_c2', 5n)).ok)
  await finish('tx_c1', 'inv_C', 'paid', '0xc1', 1)
  t.same((await books[0].live('inv_P'))!.chain, ['0xc1'], "a child's payment joins the open parent's chain")
  await inTx(stores[1], 'usage\u0000s', (tx) => books[1].close(tx, 'inv_C', 'closed', 3))
  const p = (await books[0].live('inv_P'))!
  t.same([p.spent, p.holds], ['20', { tx_c2: '5' }], 'spent moved up, the unknown payment is held in the parent')
  await finish('tx_c2', 'inv_C', 'paid', '0xc2', 4)
  t.match(await books[1].live('inv_P'), { spent: '25', chain: ['0xc1', '0xc2'] }, 'and settles there')
})

t.test('shared: the open invocations of a replica that is gone are orphans for the others, not for it', async (t) => {
  const { books, stores, alive } = await twoReplicas(t)
  await stores[0].batch(books[0].opened(rec('inv_o1', 10n, null, newInvocationToken(), ['o'])))
  await stores[1].batch(books[1].opened(rec('inv_o2', 10n, null, newInvocationToken(), ['o'])))
  t.same(await books[1].orphans(), [], 'both replicas alive: nothing to take over')
  alive.delete('r1')
  t.same(
    (await books[1].orphans()).map((r) => [r.id, r.owner]),
    [['inv_o1', 'r1']],
    "r1's invocation, once r1 is gone",
  )
  t.same(await books[0].orphans(), [], 'never its own')
  await inTx(stores[1], 'usage\u0000o', (tx) => books[1].close(tx, 'inv_o1', 'interrupted', 5))
  t.same(await books[1].orphans(), [], 'closed: no longer open')
})

t.test('shared: a hold waits for a close of the same tree on another replica, then finds it closed', async (t) => {
  const { books, stores } = await twoReplicas(t)
  await stores[0].batch(books[0].opened(rec('inv_w', 100n, null, newInvocationToken(), ['o'])))
  let release!: () => void
  const gate = new Promise<void>((r) => (release = r))
  const closing = inTx(stores[0], 'usage\u0000o', async (tx) => {
    const r = await books[0].close(tx, 'inv_w', 'closed', 5)
    await gate // the tree stays locked until this section's batch is written
    return r
  })
  await sleep(100)
  const holding = hold(stores[1], books[1], 'a', 'inv_w', 'tx_late', 10n)
  await sleep(100)
  release()
  await closing
  t.match(await holding, { ok: false, detail: 'invocation closed' }, 'the payment read the tree after the close was written')
})
