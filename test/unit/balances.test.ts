import t from 'tap'
import { Balances } from '../../src/engine/balances.js'
import { ManualClock } from '../../src/util/clock.js'

const ADDR = '0x00000000000000000000000000000000000000aa' as const

/** A chain whose balance reads the test answers by hand. */
function chain(): { read: (a: `0x${string}`) => Promise<bigint>; calls: () => number; answer: (v: bigint) => void; fail: (e: Error) => void } {
  const waiting: { resolve: (v: bigint) => void; reject: (e: Error) => void }[] = []
  let calls = 0
  return {
    read: () => {
      calls++
      return new Promise<bigint>((resolve, reject) => waiting.push({ resolve, reject }))
    },
    calls: () => calls,
    answer: (v) => waiting.shift()!.resolve(v),
    fail: (e) => waiting.shift()!.reject(e),
  }
}

/** Balances over a hand-answered chain, with a first reading of 100 taken at the clock's start. */
async function primed(opts: ConstructorParameters<typeof Balances>[2] = {}): Promise<{ c: ReturnType<typeof chain>; clock: ManualClock; b: Balances }> {
  const c = chain()
  const clock = new ManualClock()
  const b = new Balances(c.read, clock, opts)
  const first = b.balance(ADDR, 10n, 0n)
  c.answer(100n)
  await first
  return { c, clock, b }
}

/** Whether `p` has settled once pending callbacks ran. */
async function settled(p: Promise<unknown>): Promise<boolean> {
  let done = false
  p.then(
    () => (done = true),
    () => (done = true),
  )
  await new Promise((r) => setImmediate(r))
  return done
}

t.test('the first reading is awaited, and concurrent callers share it', async (t) => {
  const c = chain()
  const b = new Balances(c.read, new ManualClock())
  const p1 = b.balance(ADDR, 10n, 0n)
  const p2 = b.balance(ADDR, 10n, 0n)
  t.equal(await settled(p1), false, 'waits for the chain')
  t.equal(c.calls(), 1, 'one read for both')
  c.answer(100n)
  t.same(await Promise.all([p1, p2]), [100n, 100n])
})

t.test('within the TTL: no read, the reading less what was committed since', async (t) => {
  const { c, clock, b } = await primed({ ttlMs: 5000 })
  b.spend(ADDR.toUpperCase().replace('0X', '0x'), 30n)
  clock.advance(4999)
  t.equal(await b.balance(ADDR, 10n, 0n), 70n)
  t.equal(c.calls(), 1)
})

t.test('past the TTL an approving estimate answers at once while a fresh reading is fetched', async (t) => {
  const { c, clock, b } = await primed({ ttlMs: 5000, maxStaleMs: 20_000 })
  clock.advance(6000)
  const stale = b.balance(ADDR, 10n, 20n)
  t.equal(await settled(stale), true, 'not held behind the chain')
  t.equal(await stale, 100n)
  t.equal(c.calls(), 2, 'a refresh went out')
  t.equal(await b.balance(ADDR, 10n, 20n), 100n, 'still the old reading meanwhile')
  t.equal(c.calls(), 2, 'one refresh at a time')
  b.spend(ADDR, 5n) // committed while the read is out: not in its answer
  c.answer(250n)
  await new Promise((r) => setImmediate(r))
  t.equal(await b.balance(ADDR, 10n, 0n), 245n, 'the fresh reading, less what was committed since it was sent')
  t.equal(c.calls(), 2)
})

t.test('an estimate that would refuse waits for a fresh reading (incoming funds are seen)', async (t) => {
  const { c, b } = await primed({ ttlMs: 5000 })
  const p = b.balance(ADDR, 95n, 10n) // 100 - 10 held < 95
  t.equal(await settled(p), false, 'waits, even within the TTL')
  c.answer(1000n)
  t.equal(await p, 1000n)
})

t.test('past maxStaleMs the payment waits for the chain; a failed refresh is reported', async (t) => {
  const errors: unknown[] = []
  const { c, clock, b } = await primed({ ttlMs: 5000, maxStaleMs: 20_000, onRefreshError: (e) => errors.push(e) })
  clock.advance(6000)
  t.equal(await b.balance(ADDR, 10n, 0n), 100n)
  c.fail(new Error('chain down'))
  await new Promise((r) => setImmediate(r))
  t.equal(errors.length, 1, 'the background failure is told')
  t.equal(await b.balance(ADDR, 10n, 0n), 100n, 'the old reading stays in use')
  c.fail(new Error('still down'))
  await new Promise((r) => setImmediate(r))
  t.equal(errors.length, 2)
  clock.advance(14_000) // 20 s old
  const p = b.balance(ADDR, 10n, 0n)
  t.equal(await settled(p), false, 'too old: waits')
  c.fail(new Error('down for good'))
  await t.rejects(p, /down for good/, 'and fails with the chain')
})
