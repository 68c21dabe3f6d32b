import t from 'tap'
import { capHeld, capLeft, closeNested, decideCapHold, emptyCap, fitsCap, holdUnder, settleUnder } from '../../src/policy/caps.js'
import { decide } from '../../src/policy/decide.js'
import { defaultPolicy, mergePolicy } from '../../src/policy/model.js'
import { capHoldId, commit, coveredByCap, emptyUsage, heldAmount, hold, holdDrawn, paymentHeldAmount, paymentsInFlight, release, type UsageState } from '../../src/policy/usage.js'
import { outputOf } from '../../src/invoke/answer.js'

/** The invocation money model as pure rules: caps, cap holds, draw-downs, nesting. */
const now = Date.parse('2026-06-01T00:00:00Z')
const policy = (body: object) => mergePolicy(defaultPolicy(), body, 'a')
const U = 1_000_000n

t.test('a payment fits when spent + held + P <= C; a hold takes the room, settling moves it', async (t) => {
  let s = emptyCap(100n)
  t.same(fitsCap(s, 100n), { ok: true }, 'the whole cap fits')
  s = holdUnder(s, 'tx_a', 60n)
  t.equal(capHeld(s), 60n)
  t.notOk(fitsCap(s, 41n).ok, 'held counts')
  t.ok(fitsCap(s, 40n).ok)
  s = settleUnder(s, 'tx_a', true)
  t.same([s.spent, capHeld(s), capLeft(s)], ['60', 0n, 40n], 'paid: the hold becomes spend')
  s = settleUnder(holdUnder(s, 'tx_b', 40n), 'tx_b', false)
  t.same([s.spent, capHeld(s), capLeft(s)], ['60', 0n, 40n], 'failed: the hold is dropped')
  t.same(settleUnder(s, 'tx_unknown', true), s, 'a hold that is not there changes nothing')
  const refused = fitsCap(s, 41n)
  t.match(refused, { ok: false, detail: /exceed the invocation budget/ })
})

t.test('nesting: a child cap is carved from the parent; at its close spent moves up, unknown payments stay held', async (t) => {
  let parent = holdUnder(emptyCap(100n), 'inv_child', 50n)
  t.notOk(fitsCap(parent, 51n).ok, "the carved cap is the parent's held")
  let child = emptyCap(50n)
  child = settleUnder(holdUnder(child, 'tx_1', 20n), 'tx_1', true)
  child = holdUnder(child, 'tx_2', 5n) // still unknown at the close
  parent = closeNested(parent, 'inv_child', child)
  t.same(parent.spent, '20')
  t.same(parent.holds, { tx_2: '5' }, 'the carved cap is released, the unknown payment held')
  t.equal(capLeft(parent), 75n)
  t.same(settleUnder(parent, 'tx_2', true).spent, '25', 'it settles in the parent')
})

t.test('opening: the domain lists apply to the endpoint and the cap must fit the daily budget', async (t) => {
  const u: UsageState = { ...emptyUsage(), periodStart: now - 1000, spent: String(U) }
  t.match(decideCapHold(policy({ blockedDomains: ['bad.com'] }), u, { host: 'bad.com', cap: 1n }, now), { ok: false, reason: 'domain_blocked' })
  t.match(decideCapHold(policy({ allowedDomains: ['good.com'] }), u, { host: 'bad.com', cap: 1n }, now), { ok: false, reason: 'domain_not_allowed' })
  t.same(decideCapHold(policy({ dailyBudget: { usdc: 3 } }), u, { host: 'x.com', cap: 2n * U }, now), { ok: true }, '1 spent + 2 = 3')
  t.match(decideCapHold(policy({ dailyBudget: { usdc: 3 } }), u, { host: 'x.com', cap: 2n * U + 1n }, now), { ok: false, reason: 'daily_budget_exceeded' })
  const held = hold(u, { id: capHoldId('inv_x'), amount: String(U), at: now, cap: true })
  t.match(decideCapHold(policy({ dailyBudget: { usdc: 3 } }), held, { host: 'x.com', cap: 2n * U }, now), { ok: false, reason: 'daily_budget_exceeded' }, 'other cap holds count')
  t.same(
    decideCapHold(policy({ perCallLimit: { usdc: 0.1 }, rateLimit: { calls: 1, window: '1m' } }), { ...u, payments: [now - 1] }, { host: 'x.com', cap: 5n * U }, now),
    { ok: true },
    'per-call and rate limits are for payments',
  )
})

t.test('cap holds count toward the daily budget, not the rate limit nor the wallet funds', async (t) => {
  const u = hold(hold(emptyUsage(), { id: capHoldId('i'), amount: '500', at: now, cap: true }), { id: 'tx_p', amount: '7', at: now })
  t.same([heldAmount(u), paymentHeldAmount(u), paymentsInFlight(u)], [507n, 7n, 1])
  t.ok(decide(policy({ rateLimit: { calls: 2, window: '1m' } }), u, { host: 'x.com', amount: 1n }, now).ok, 'one payment in flight of 2 allowed')
  t.match(decide(policy({ dailyBudget: { usdc: 0.000507 } }), u, { host: 'x.com', amount: 1n }, now), { ok: false, reason: 'daily_budget_exceeded' })
})

t.test("the orchestrator's own payment inside its invocation draws on the cap hold: counted once", async (t) => {
  const cap = capHoldId('i')
  const u = hold(emptyUsage(), { id: cap, amount: '50', at: now, cap: true })
  const budget = policy({ dailyBudget: { usdc: 0.00005 } })
  t.notOk(decide(budget, u, { host: 'x.com', amount: 20n }, now).ok, 'counted twice it would not fit')
  const covered = coveredByCap(u, cap, 20n)
  t.equal(covered, 20n)
  t.ok(decide(budget, u, { host: 'x.com', amount: 20n, covered }, now).ok, 'covered by the cap hold it fits')
  const drawn = holdDrawn(u, { id: 'tx_o', amount: '20', at: now }, cap)
  t.equal(heldAmount(drawn), 50n, 'the total held is unchanged')
  t.match(drawn.holds, [
    { id: cap, amount: '30' },
    { id: 'tx_o', amount: '20', from: cap, drawn: '20' },
  ])
  t.same(release(drawn, 'tx_o').holds, [{ id: cap, amount: '50', at: now, cap: true }], 'a failed payment gives back what it drew')
  const paid = commit(drawn, 'tx_o', now, 0)
  t.same([paid.spent, heldAmount(paid)], ['20', 30n], 'paid: spend, and the rest stays held until the close')
  t.same(release(paid, cap).holds, [], 'the close releases the rest')
  t.same(release(release(drawn, cap), 'tx_o').holds, [], 'after the close a failure has nothing to give back to')
  t.equal(coveredByCap(u, cap, 80n), 50n, 'covered at most by what is left')
  t.equal(coveredByCap(u, 'cap:other', 5n), 0n)
  const over = holdDrawn(u, { id: 'tx_big', amount: '80', at: now }, cap)
  t.match(over.holds, [{ id: cap, amount: '0' }, { drawn: '50' }])
})

t.test("the invocation's output: an `output` field, else the JSON, else the text", async (t) => {
  t.same(outputOf(Buffer.from('{"output":{"a":1},"other":2}')), { a: 1 })
  t.same(outputOf(Buffer.from('{"output":null}')), null)
  t.same(outputOf(Buffer.from('{"result":3}')), { result: 3 })
  t.same(outputOf(Buffer.from('[1,2]')), [1, 2])
  t.same(outputOf(Buffer.from('42')), 42)
  t.same(outputOf(Buffer.from('"s"')), 's')
  t.same(outputOf(Buffer.from('plain words')), 'plain words')
  t.same(outputOf(Buffer.from('{broken')), '{broken')
  t.same(outputOf(Buffer.from('')), '')
})
