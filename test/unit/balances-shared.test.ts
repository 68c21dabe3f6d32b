import t, { type Test } from 'tap'
import { Balances, WalletSpend } from '../../src/engine/balances.js'
import { Store } from '../../src/store/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { testStore, testDir } from '../helpers/gateway.js'

/**
 * The funds check with replicas on one PostgreSQL database: each replica's `Balances` reads
 * the wallet's committed total from the store (`WalletSpend`), so a payment committed through
 * another replica is subtracted at once, with no chain read.
 */

const ADDR = '0x00000000000000000000000000000000000000aa' as const

/** A chain whose balance reads the test answers by hand. */
function chain(): { read: (a: `0x${string}`) => Promise<bigint>; calls: () => number; answer: (v: bigint) => void } {
  const waiting: ((v: bigint) => void)[] = []
  let calls = 0
  return {
    read: () => {
      calls++
      return new Promise<bigint>((resolve) => waiting.push(resolve))
    },
    calls: () => calls,
    answer: (v) => waiting.shift()!(v),
  }
}

/** Two replicas: two store connections to one database, each with its own Balances (one chain). */
async function replicas(t: Test) {
  const { store: a, url } = await testStore(t, undefined, 'postgres')
  const b = await Store.open(testDir(t), { postgresUrl: url! })
  t.teardown(() => b.close())
  const c = chain()
  const clock = new ManualClock()
  const mk = (s: Store) => {
    const spend = new WalletSpend(s)
    return { store: s, spend, balances: new Balances(c.read, clock, { ttlMs: 5000, shared: spend }) }
  }
  return { a: mk(a), b: mk(b), c, clock }
}

/** A payment committed as the recorder does on PostgreSQL: the total's write in the agent's locked transaction. */
async function commitThrough(r: { store: Store; balances: Balances }, amount: bigint): Promise<void> {
  const { written } = await r.store.transact('usage\u0000agent', async () => ({ ops: await r.balances.spendOps(ADDR, amount), result: null }))
  const w = await written
  if (!w.ok) throw w.error
  r.balances.spend(ADDR, amount) // what the recorder also calls after: nothing more when shared
}

/** Answer the chain read `p` is waiting for once it has been sent (the committed total is read first). */
async function answered<T>(c: ReturnType<typeof chain>, p: Promise<T>, calls: number, v: bigint): Promise<T> {
  while (c.calls() < calls) await new Promise((r) => setImmediate(r))
  c.answer(v)
  return p
}

t.test('a payment committed through another replica is subtracted at once, without a chain read', async (t) => {
  const { a, b, c } = await replicas(t)
  t.equal(await answered(c, a.balances.balance(ADDR, 10n, 0n), 1, 100n), 100n, 'the first reading')
  await commitThrough(b, 30n)
  t.equal(await a.balances.balance(ADDR, 10n, 0n), 70n, "A's estimate counts B's payment")
  await commitThrough(a, 5n)
  t.equal(await a.balances.balance(ADDR, 10n, 0n), 65n, 'and its own, once')
  t.equal(c.calls(), 1, 'no chain read since the first')
  t.equal(await b.spend.total(ADDR.toUpperCase().replace('0X', '0x')), 35n, 'one total per address, whatever its case')

  // Without the shared total (as before), A would approve on what only it committed.
  const local = new Balances(c.read, new ManualClock(), { ttlMs: 5000 })
  t.equal(await answered(c, local.balance(ADDR, 10n, 0n), 2, 100n), 100n)
  await commitThrough({ store: b.store, balances: local }, 30n)
  t.equal(await local.balance(ADDR, 10n, 0n), 70n, 'a process-local Balances counts only its own spend() (here: 30)')
})

t.test('a payment committed while the chain read is out is subtracted from its answer (erring low, never missed)', async (t) => {
  const { a, b, c } = await replicas(t)
  await commitThrough(b, 7n) // before any reading: already in the chain's answer below
  const p = a.balances.balance(ADDR, 10n, 0n)
  while (c.calls() < 1) await new Promise((r) => setImmediate(r))
  await commitThrough(b, 5n) // committed after the read was sent: not in its answer
  c.answer(250n)
  t.equal(await p, 245n)
})

t.test('an estimate that would refuse is read fresh from the chain, and the total still applies', async (t) => {
  const { a, b, c } = await replicas(t)
  await answered(c, a.balances.balance(ADDR, 10n, 0n), 1, 100n)
  await commitThrough(b, 95n)
  const p = a.balances.balance(ADDR, 10n, 0n)
  t.equal(await answered(c, p, 2, 500n), 500n, 'refreshed (funds arrived); the 95 was committed before this read was sent')
  await commitThrough(b, 100n)
  t.equal(await a.balances.balance(ADDR, 10n, 0n), 400n)
  t.equal(c.calls(), 2)
})

t.test('the total is exact under concurrent payments from two replicas (the agent lock orders them)', async (t) => {
  const { a, b } = await replicas(t)
  await Promise.all(Array.from({ length: 40 }, (_, i) => commitThrough(i % 2 ? a : b, BigInt(i + 1))))
  t.equal(await a.spend.total(ADDR), 820n, 'the sum of 1..40')
})

t.test('LevelDB (one process): no store read, spend() counts as before', async (t) => {
  const { store } = await testStore(t)
  const c = chain()
  const bal = new Balances(c.read, new ManualClock(), { ttlMs: 5000 })
  t.same(await bal.spendOps(ADDR, 5n), [], 'no write to add')
  await answered(c, bal.balance(ADDR, 10n, 0n), 1, 100n)
  bal.spend(ADDR, 30n)
  t.equal(await bal.balance(ADDR, 10n, 0n), 70n)
  t.equal(await new WalletSpend(store).total(ADDR), 0n, 'nothing stored')
})
