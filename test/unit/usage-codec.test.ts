import t from 'tap'
import { Registry } from '../../src/agents/registry.js'
import { LevelStore } from '../../src/store/index.js'
import { PolicyStore } from '../../src/policy/store.js'
import { commit, EXACT_PAYMENTS, hold, paymentsWithin, type UsageState } from '../../src/policy/usage.js'
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
})

t.test('usage of an earlier version, with its times as an array, is read as it is', async (t) => {
  const old = { periodStart: base, spent: '7', payments: [base, base + 10], perMinute: [[base - (base % 60_000), 2]] }
  t.same(usageFromStore(old as StoredUsage), old)
})

t.test('with a full window of times the stored usage is under half its JSON as an array', async (t) => {
  let u: UsageState = { periodStart: null, spent: '0', payments: [] }
  for (let i = 0; i < EXACT_PAYMENTS + 10; i++) {
    const now = base + i * 700
    u = commit(hold(u, { id: `tx_${i}`, amount: '1', at: now }), `tx_${i}`, now, 0)
  }
  t.equal(u.payments.length, EXACT_PAYMENTS)
  const asArray = JSON.stringify(u).length
  const stored = JSON.stringify(storedUsage(u)).length
  t.ok(stored * 2 < asArray, `${stored} characters against ${asArray}`)
  // and a hold, which keeps the same times, reads back the same
  const held = hold(u, { id: 'next', amount: '1', at: base + 99_000 })
  t.same(usageFromStore(JSON.parse(JSON.stringify(storedUsage(held)))), held)
  t.equal(paymentsWithin(usageFromStore(JSON.parse(JSON.stringify(storedUsage(u)))), base + 74 * 700, 60_000), paymentsWithin(u, base + 74 * 700, 60_000))
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
