import t from 'tap'
import { Registry } from '../../src/agents/registry.js'
import { LevelStore } from '../../src/store/index.js'
import { PolicyStore } from '../../src/policy/store.js'
import { commit, countSessionCall, EXACT_PAYMENTS, HOUR_MS, hold, paymentsWithin, type UsageState } from '../../src/policy/usage.js'
import { type StoredUsage, storedUsage, usageFromStore } from '../../src/policy/usage-codec.js'
import { systemClock } from '../../src/util/clock.js'
import { testDir } from '../helpers/gateway.js'

const base = 1_795_816_066_731

t.test('payment times round-trip through their stored string: none, one, many, and a clock that stepped back', async (t) => {
  const cases = [[], [base], Array.from({ length: 64 }, (_, i) => base + i * 1500), [base, base + 5, base + 2, base + 2, base + 86_400_000]]
  for (const payments of cases) {
    const u: UsageState = { periodStart: base, spent: '12', payments, holds: [{ id: 'tx_1', amount: '3', at: base }] }
    const stored = JSON.parse(JSON.stringify(storedUsage(u))) as StoredUsage
    t.equal(typeof stored.payments, 'string')
    t.same(usageFromStore(stored), u, `${payments.length} times`)
  }
})

t.test('times that are not whole milliseconds stay an array', async (t) => {
  const u: UsageState = { periodStart: base, spent: '1', payments: [base + 0.1, base + 0.3] }
  t.same(storedUsage(u).payments, u.payments)
  t.same(usageFromStore(JSON.parse(JSON.stringify(storedUsage(u)))), u)
  // and one such time added to a list already encoded: the new list stays an array too
  const whole: UsageState = { periodStart: base, spent: '1', payments: [base, base + 1000] }
  t.equal(storedUsage(whole).payments, `${base},1000`)
  const next: UsageState = { ...whole, payments: [...whole.payments, base + 1500.5] }
  t.same(storedUsage(next, whole).payments, next.payments)
})

t.test('usage of an earlier version, with its times and buckets as arrays, is read as it is', async (t) => {
  const old = {
    periodStart: base,
    spent: '7',
    payments: [base, base + 10],
    perMinute: [[base - (base % 60_000), 2]],
    perHour: [[base - (base % HOUR_MS), 2]],
    sessionCalls: { total: 3, hours: [[base - (base % HOUR_MS), 3]] },
  }
  t.same(usageFromStore(old as StoredUsage), old)
  const half = { periodStart: base, spent: '7', payments: `${base},10`, perMinute: [[base - (base % 60_000), 2]] }
  t.same(usageFromStore(half as StoredUsage), { ...half, payments: [base, base + 10] }, 'times as a string, buckets as arrays')
})

t.test('minute, hour and session buckets round-trip through their strings: gaps, a clock that stepped back, buckets off whole sizes', async (t) => {
  const m = base - (base % 60_000)
  const h = base - (base % HOUR_MS)
  const u: UsageState = {
    periodStart: base,
    spent: '9',
    payments: [base],
    perMinute: [
      [m - 120_000, 1],
      [m - 60_000, 4],
      [m, 60],
      [m - 60_000, 2],
    ],
    perHour: [
      [h - 3 * HOUR_MS, 7],
      [h, 3600],
    ],
    sessionCalls: { total: 12, hours: [[h, 12]] },
  }
  const stored = JSON.parse(JSON.stringify(storedUsage(u))) as StoredUsage
  t.equal(stored.perMinute, `${m / 60_000 - 2}:1,1:4,1:60,-1:2`)
  t.equal(stored.perHour, `${h / HOUR_MS - 3}:7,3:3600`)
  t.equal(stored.sessionCalls!.hours, `${h / HOUR_MS}:12`)
  t.same(usageFromStore(stored), u)
  const off: UsageState = { ...u, perMinute: [[m + 1, 2]] }
  t.same(storedUsage(off).perMinute, off.perMinute, 'a bucket not on a whole minute stays an array')
  t.same(usageFromStore(JSON.parse(JSON.stringify(storedUsage(off)))), off)
  t.same(usageFromStore(JSON.parse(JSON.stringify(storedUsage({ ...u, perMinute: [], perHour: [] })))), { ...u, perMinute: [], perHour: [] }, 'empty lists')
})

/** A seeded generator of numbers in [0, 1). */
function seeded(seed: number): () => number {
  let s = seed
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0
    return s / 2 ** 32
  }
}

t.test("a usage's lists encoded from those it was made from equal their whole encoding, over days of holds, commits and session calls", async (t) => {
  const rand = seeded(7)
  let now = base
  let u: UsageState = { periodStart: null, spent: '0', payments: [] }
  let checked = 0
  const wrong: string[] = []
  for (let i = 0; i < 6000; i++) {
    // Bursts, pauses of minutes to hours, and now and then a clock stepped back.
    const r = rand()
    now += r < 0.6 ? Math.floor(rand() * 2000) : r < 0.9 ? Math.floor(rand() * 600_000) : r < 0.98 ? Math.floor(rand() * 3 * HOUR_MS) : -Math.floor(rand() * 90_000)
    const held = hold(u, { id: `tx_${i}`, amount: '5', at: now })
    // (every hold is committed: holds left open would pile up and slow each step, and they are plain JSON)
    const committed = commit(held, `tx_${i}`, now, rand() < 0.5 ? 0 : 100)
    const next = rand() < 0.1 ? countSessionCall(committed, now) : committed
    for (const [after, before] of [
      [held, u],
      [next, held],
    ] as const) {
      const derived = JSON.stringify(storedUsage(after, before))
      // The same lists copied: nothing cached for them, so encoded whole.
      const copy: UsageState = JSON.parse(JSON.stringify(after))
      const whole = JSON.stringify(storedUsage(copy))
      if (derived !== whole) wrong.push(`step ${i}: ${derived} against ${whole}`)
      else if (JSON.stringify(usageFromStore(JSON.parse(derived))) !== JSON.stringify(after)) wrong.push(`step ${i}: read back differs`)
      checked++
    }
    u = next
  }
  t.equal(checked, 12_000, 'encodings compared')
  t.same(wrong.slice(0, 3), [], `${wrong.length} differ`)
  t.ok(u.perMinute!.length > 1 && u.perHour!.length > 1 && u.sessionCalls!.hours.length > 1, 'every list held several entries')
})

t.test('with a full window of times and a day of buckets the stored usage is under half its JSON as arrays', async (t) => {
  let u: UsageState = { periodStart: null, spent: '0', payments: [] }
  for (let i = 0; i < 1500; i++) {
    const now = base + i * 70_000
    u = commit(hold(u, { id: `tx_${i}`, amount: '1', at: now }), `tx_${i}`, now, 0)
  }
  t.equal(u.payments.length, EXACT_PAYMENTS)
  t.ok(u.perMinute!.length > 50 && u.perHour!.length >= 24, 'an hour of minutes and a day of hours')
  const asArray = JSON.stringify(u).length
  const stored = JSON.stringify(storedUsage(u)).length
  t.ok(stored * 2 < asArray, `${stored} characters against ${asArray}`)
  // and a hold, which keeps the same times, reads back the same
  const held = hold(u, { id: 'next', amount: '1', at: base + 99_000 })
  t.same(usageFromStore(JSON.parse(JSON.stringify(storedUsage(held)))), held)
  const later = base + 1500 * 70_000
  for (const w of [60_000, HOUR_MS, 24 * HOUR_MS]) t.equal(paymentsWithin(usageFromStore(JSON.parse(JSON.stringify(storedUsage(u)))), later, w), paymentsWithin(u, later, w))
})

t.test('the policy store writes usage in the stored form and reads it back after a restart', async (t) => {
  const dir = testDir(t, 'paygate-usage-')
  let store = await LevelStore.open(dir)
  let policies = new PolicyStore(store, new Registry(store, systemClock), systemClock)
  let u: UsageState = { periodStart: null, spent: '0', payments: [] }
  for (let i = 0; i < 5; i++) u = commit(hold(u, { id: `tx_${i}`, amount: '2', at: base + i }), `tx_${i}`, base + i * 1000, 0)
  u = hold(u, { id: 'open', amount: '4', at: base + 9000 })
  await store.batch([policies.usageOp('a1', u)])
  const raw = (await store.collection<StoredUsage>('usage').get('a1'))!
  t.equal(raw.payments, `${base},1000,1000,1000,1000`)
  await store.close()
  store = await LevelStore.open(dir)
  t.teardown(() => store.close())
  policies = new PolicyStore(store, new Registry(store, systemClock), systemClock)
  t.same(await policies.usageOf('a1'), u)
})
