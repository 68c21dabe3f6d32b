import t from 'tap'
import { InvocationBook, newInvocationToken, tokenHash, type InvocationRecord } from '../../src/policy/invocations.js'
import { Store } from '../../src/store/index.js'
import { testStore } from '../helpers/gateway.js'

/** The book of open invocations on a real store: tokens, caps under concurrency, settling, nested closes, what is stored. */
const rec = (id: string, cap: bigint, parentId: string | null, token: string, invokers: string[]): InvocationRecord => ({
  ...{ id, agentId: invokers[invokers.length - 1]!, status: 'open', createdAt: 1, tokenHash: tokenHash(token), rootTxId: `tx_root_${id}`, rootTxHash: `0x${id}` },
  ...{ depth: parentId ? 1 : 0, parentId, invokers, agentEndpoint: 'http://127.0.0.1:1/', cap: cap.toString(), spent: '0', holds: {}, capHold: false, chain: [] },
})
const paid = (id: string, invId: string, hash: string) => ({ kind: 'paid', record: { id, status: 'paid', txHash: hash, invocation: { id: invId } } })
const failed = (id: string, invId: string) => ({ kind: 'finished', record: { id, status: 'failed', txHash: null, invocation: { id: invId } } })

t.test('tokens resolve while open; a closed one is budget_exceeded "invocation closed"', async (t) => {
  const { store } = await testStore(t)
  const book = new InvocationBook(store)
  const token = newInvocationToken()
  await store.batch(book.opened(rec('inv_a', 100n, null, token, ['o'])))
  t.equal((await book.resolve(token)).id, 'inv_a')
  await t.rejects(book.resolve(newInvocationToken()), { code: 'budget_exceeded', detail: /not one of an open invocation/ })
  const { closed, ops } = book.close('inv_a', 'closed', 5)
  await store.batch(ops)
  t.match(closed[0], { id: 'inv_a', status: 'closed', closedAt: 5, pending: '0' })
  await t.rejects(book.resolve(token), { code: 'budget_exceeded', detail: /invocation closed/ })
  t.match(await book.get('inv_a'), { status: 'closed' }, 'stored')
})

t.test('concurrent holds never take more than the cap; settling moves holds to spent and builds the chain', async (t) => {
  const { store } = await testStore(t)
  const book = new InvocationBook(store)
  await store.batch(book.opened(rec('inv_b', 100n, null, newInvocationToken(), ['o'])))
  const taken = Array.from({ length: 15 }, (_, i) => book.holdPayment('inv_b', `tx_${i}`, 10n)).filter((x) => x !== null)
  t.equal(taken.length, 10, 'exactly 10 of 15 payments of 10 under a cap of 100')
  t.match(book.fits('inv_b', 1n), { ok: false })
  book.contributor(paid('tx_0', 'inv_b', '0xh0'))
  book.contributor(failed('tx_1', 'inv_b'))
  book.contributor({ kind: 'finished', record: { id: 'tx_2', status: 'unknown', txHash: null, invocation: { id: 'inv_b' } } })
  const now = book.openRecord('inv_b')!
  t.same([now.spent, Object.keys(now.holds).length, now.chain], ['10', 8, ['0xh0']])
  t.ok(book.fits('inv_b', 10n).ok, 'the failed payment gave its room back')
  const { closed, ops } = book.close('inv_b', 'closed', 9)
  await store.batch(ops)
  t.equal(closed[0]!.pending, '80', 'what is still open at the close is pending')
})

t.test('nesting: the carve, the close of the child into the parent, and a parent close that closes the child', async (t) => {
  const { store } = await testStore(t)
  const book = new InvocationBook(store)
  await store.batch(book.opened(rec('inv_p', 100n, null, newInvocationToken(), ['o'])))
  t.match(book.carve('inv_p', 'inv_c', 101n), { ok: false })
  const carved = book.carve('inv_p', 'inv_c', 60n)
  t.ok(carved.ok)
  await store.batch(book.opened(rec('inv_c', 60n, 'inv_p', newInvocationToken(), ['o', 's'])))
  t.notOk(book.fits('inv_p', 41n).ok, "the child's cap is held in the parent")
  book.holdPayment('inv_c', 'tx_c1', 20n)
  book.holdPayment('inv_c', 'tx_c2', 5n)
  book.contributor(paid('tx_c1', 'inv_c', '0xc1'))
  t.same(book.openRecord('inv_p')!.chain, ['0xc1'], "a child's payment joins the open parent's chain")
  const child = book.close('inv_c', 'closed', 3)
  await store.batch(child.ops)
  const p = book.openRecord('inv_p')!
  t.same([p.spent, p.holds], ['20', { tx_c2: '5' }], 'spent moved up, the unknown payment is held in the parent')
  book.contributor(paid('tx_c2', 'inv_c', '0xc2'))
  t.same(book.openRecord('inv_p')!.spent, '25', 'and settles there')

  // A parent closed while a child is open closes the child too.
  book.carve('inv_p', 'inv_d', 10n)
  const tokenD = newInvocationToken()
  await store.batch(book.opened(rec('inv_d', 10n, 'inv_p', tokenD, ['o', 's'])))
  const all = book.close('inv_p', 'interrupted', 7)
  t.same(
    all.closed.map((c) => [c.id, c.status]),
    [
      ['inv_p', 'interrupted'],
      ['inv_d', 'interrupted'],
    ],
  )
  await store.batch(all.ops)
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
  const { closed } = next.close('inv_z', 'interrupted', 11)
  t.match(closed[0], { status: 'interrupted', closedAt: 11 })
})
