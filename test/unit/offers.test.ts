import t from 'tap'
import { Readable } from 'node:stream'
import type { Detected, Plan } from '../../src/engine/adapters/types.js'
import { choosePlan, read402, type Detection } from '../../src/engine/offers.js'

const plan = (protocol: 'x402' | 'mpp', amount = 10n): Plan => ({ protocol, amount, rail: 'stablecoin' }) as unknown as Plan
const payable = (protocol: 'x402' | 'mpp', amount?: bigint): Detection => ({ protocol, detected: { present: true, plan: plan(protocol, amount) } })
const unpayable = (protocol: 'x402' | 'mpp', extra: Partial<Extract<Detected, { plan: null }>> = {}): Detection => ({
  protocol,
  detected: { present: true, plan: null, why: `${protocol} problem`, malformed: false, ...extra },
})
const absent = (protocol: 'x402' | 'mpp'): Detection => ({ protocol, detected: { present: false } })

t.test('the preference picks among payable offers', async (t) => {
  const both = [payable('x402'), payable('mpp')]
  t.equal((choosePlan(both, 'auto', true) as { plan: Plan }).plan.protocol, 'x402', 'auto prefers x402')
  t.equal((choosePlan(both, 'mpp', true) as { plan: Plan }).plan.protocol, 'mpp')
  t.equal((choosePlan([absent('x402'), payable('mpp')], 'x402', true) as { plan: Plan }).plan.protocol, 'mpp', 'x402 if available, else what is')
  const twoMpp = [{ protocol: 'mpp' as const, detected: { present: true as const, plan: plan('mpp', 1n) } }, payable('mpp', 2n)]
  t.equal((choosePlan(twoMpp, 'auto', true) as { plan: Plan }).plan.amount, 1n, 'the first payable adapter of a protocol wins')
})

t.test('nothing payable: which error', async (t) => {
  t.match(choosePlan([absent('x402'), absent('mpp')], 'auto', true), { unpaid: { code: 'payment_protocol_error' } }, 'no known shape')
  t.match(choosePlan([unpayable('x402', { malformed: true })], 'auto', true), { unpaid: { code: 'payment_protocol_error' } }, 'every present one malformed')
  t.match(choosePlan([unpayable('x402'), unpayable('mpp', { malformed: true })], 'auto', true), { unpaid: { code: 'no_payable_offer' } })
  t.match(choosePlan([payable('x402', 0n)], 'auto', true), { unpaid: { code: 'no_payable_offer', detail: /0 USDC/ } }, 'an offer of 0 USDC is not paid')
})

t.test('expired challenges of the preferred protocol are fetched again, once', async (t) => {
  const rows = [unpayable('x402', { expired: true }), payable('mpp')]
  t.match(choosePlan(rows, 'x402', true), { refetch: true }, 'rather than fall back')
  t.equal((choosePlan(rows, 'x402', false) as { plan: Plan }).plan.protocol, 'mpp', 'after the refetch, the fallback')
  t.match(choosePlan([unpayable('mpp', { expired: true })], 'auto', true), { unpaid: { code: 'no_payable_offer' }, refetch: true })
})

t.test('read402: a body up to the limit is read; a longer one is kept whole for passing on', async (t) => {
  const small = await read402({ status: 402, headers: {}, body: Readable.from([Buffer.from('{"a":1}')]) }, 1_000)
  t.equal(small.answer.body.toString(), '{"a":1}')
  t.equal(small.cut, false)
  const big = Buffer.alloc(300 * 1024, 'x')
  const cut = await read402({ status: 402, headers: { 'payment-required': 'h' }, body: Readable.from([big.subarray(0, 200 * 1024), big.subarray(200 * 1024)]) }, 1_000)
  t.equal(cut.cut, true)
  t.equal(cut.answer.body.length, 0, 'not read for offers')
  let size = 0
  for await (const c of cut.whole().body) size += (c as Buffer).length
  t.equal(size, big.length, 'passed on whole')
})

t.test('read402: a body that does not arrive whole within the deadline is upstream_unreachable', async (t) => {
  const drip = new Readable({ read() {} })
  drip.push(' ')
  const timer = setInterval(() => drip.push(' '), 20)
  t.teardown(() => clearInterval(timer))
  await t.rejects(read402({ status: 402, headers: {}, body: drip }, 150), { code: 'upstream_unreachable', detail: /did not arrive within 150 ms/ })
})
