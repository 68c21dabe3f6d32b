import t from 'tap'
import { getAddress } from 'viem'
import { chooseRail, DEFAULT_METHOD_RAILS, detectMpp, paymentBody, railOf, sessionExpiry, sessionToken, toBaseUnits, type MppOffer } from '../../src/protocols/mpp.js'
import { pickProtocol } from '../../src/policy/decide.js'
import type { PayableChain } from '../../src/protocols/types.js'
import { PaygateError } from '../../src/errors/index.js'

const chain: PayableChain = { chainId: 31337, networkName: 'paygate-devnet', token: getAddress('0x5fbdb2315678afecb367f032d93f642f64180aa3'), tokenDomain: { name: 'USD Coin', version: '2' } }
const answer = (body: unknown) => ({ status: 402, headers: {}, body: Buffer.from(typeof body === 'string' ? body : JSON.stringify(body)) })
const good = { protocol: 'mpp/1.0', amount: { value: '0.25', currency: 'USD' }, paymentMethods: ['tempo', 'stripe'], sessionSupported: true, paymentEndpoint: '/pay' }

t.test('toBaseUnits: exact decimal conversion, never through floats', async (t) => {
  const ok: [string, string, bigint][] = [
    ['0.01', 'USD', 10_000n],
    ['1', 'usdc', 1_000_000n],
    ['0.000001', 'USD', 1n],
    ['123456789.123456', 'USD', 123456789123456n],
    ['0.1000000', 'USD', 100_000n],
    ['0', 'USD', 0n],
  ]
  for (const [v, c, want] of ok) t.equal(toBaseUnits(v, c), want, `${v} ${c}`)
  for (const [v, c, why] of [
    ['0.0000001', 'USD', /more than 6 decimal places/],
    ['1e3', 'USD', /decimal string/],
    ['-1', 'USD', /decimal string/],
    [' 1', 'USD', /decimal string/],
    ['1', 'EUR', /currency "EUR" is not supported/],
  ] as const) {
    t.throws(() => toBaseUnits(v, c), { code: 'payment_protocol_error', detail: why }, `${v} ${c}`)
  }
  t.equal(toBaseUnits('0.02', 'EUR', { EUR: '1.5' }), 30_000n)
  t.equal(toBaseUnits('1', 'JPY', { JPY: '0.0066666' }), 6_667n, 'rounded up to the next base unit')
  t.equal(toBaseUnits('0.0000001', 'USD', { USD: '1' }), 1n, 'a configured rate also covers finer amounts (rounded up)')
})

t.test('detectMpp: the spec shape, extensions, and problems reported (not thrown)', async (t) => {
  const d = detectMpp(answer({ ...good, payTo: `0x${'ab'.repeat(20)}`, network: 'eip155:31337', sessionTtlSeconds: 600 }), 'https://api.example.com/data?q=1')
  if (!d.present || !d.offer) throw new Error('expected an offer')
  t.match(d.offer, {
    protocol: 'mpp',
    value: '0.25',
    currency: 'USD',
    amount: 250_000n,
    methods: ['tempo', 'stripe'],
    sessionSupported: true,
    paymentEndpoint: 'https://api.example.com/pay',
    network: 'eip155:31337',
    sessionTtlSeconds: 600,
  })
  t.equal(d.offer.payTo, getAddress(`0x${'ab'.repeat(20)}`))
  t.same(detectMpp(answer({ x402Version: 1, accepts: [] }), 'https://a.example/'), { present: false }, 'x402 bodies are not MPP')
  t.same(detectMpp(answer('not json mpp/1.0'), 'https://a.example/'), { present: false })
  t.same(detectMpp(answer(''), 'https://a.example/'), { present: false })
  const bad: [unknown, RegExp][] = [
    [{ ...good, protocol: 'mpp/2.0' }, /only mpp\/1.0/],
    [{ ...good, amount: '0.25' }, /amount must be an object/],
    [{ ...good, amount: { value: 0.25, currency: 'USD' } }, /amount.value must be a decimal string/],
    [{ ...good, paymentMethods: [] }, /paymentMethods/],
    [{ ...good, sessionSupported: 'yes' }, /sessionSupported/],
    [{ ...good, paymentEndpoint: 'ftp://x/pay' }, /http\(s\) URL/],
    [{ ...good, payTo: '0x1234' }, /payTo must be/],
    [{ ...good, amount: { value: '1', currency: 'GBP' } }, /GBP/],
  ]
  for (const [body, why] of bad) {
    const r = detectMpp(answer(body), 'https://a.example/')
    t.ok(r.present && !r.offer, JSON.stringify(body))
    if (r.present && !r.offer) t.match(r.problem, why)
  }
})

t.test('railOf and chooseRail: stablecoin first, card only as a fallback with a provider, then other rails', async (t) => {
  t.equal(railOf('Tempo', DEFAULT_METHOD_RAILS), 'stablecoin')
  t.equal(railOf('tempo.usdc', DEFAULT_METHOD_RAILS), 'stablecoin', 'vendor-qualified identifiers map by their first label')
  t.equal(railOf('stripe', DEFAULT_METHOD_RAILS), 'card')
  t.equal(railOf('acme', DEFAULT_METHOD_RAILS), null)
  t.equal(railOf('acme', { ...DEFAULT_METHOD_RAILS, acme: 'card' }), 'card', 'configurable')
  const offer = (methods: string[], extra: Partial<MppOffer> = {}): MppOffer => ({
    protocol: 'mpp',
    shape: 'mpp/1.0',
    value: '1',
    currency: 'USD',
    amount: 1_000_000n,
    methods,
    sessionSupported: true,
    paymentEndpoint: 'https://a.example/pay',
    payTo: null,
    network: null,
    token: null,
    sessionTtlSeconds: null,
    raw: {},
    ...extra,
  })
  const card = new Set(['card'])
  const none = new Set<string>()
  const cases: [string[], Set<string>, Partial<MppOffer>, string | null][] = [
    [['stripe', 'tempo'], card, {}, 'stablecoin:tempo'],
    [['stripe'], card, {}, 'card:stripe'],
    [['stripe'], none, {}, null],
    [['tempo'], card, { network: 'eip155:1' }, null],
    [['tempo', 'card'], card, { network: 'eip155:1' }, 'card:card'],
    [['tempo'], card, { token: getAddress(`0x${'11'.repeat(20)}`) }, null],
    [['lightning'], new Set(['lightning']), {}, 'lightning:lightning'],
    [['lightning'], card, {}, null],
    [['bitcoin'], card, {}, null],
  ]
  for (const [methods, available, extra, want] of cases) {
    const { choice, why } = chooseRail(offer(methods, extra), DEFAULT_METHOD_RAILS, available, chain)
    t.equal(choice ? `${choice.rail}:${choice.method}` : null, want, `${methods.join(',')} with ${[...available].join(',') || 'no rails'} ${JSON.stringify(extra)} ${why}`)
    if (!choice) t.not(why, '', 'says why')
  }
})

t.test('paymentBody echoes method and amount exactly as offered', async (t) => {
  const d = detectMpp(answer({ ...good, amount: { value: '0.250', currency: 'usd' }, paymentMethods: ['Tempo'] }), 'https://a.example/r')
  if (!d.present || !d.offer) throw new Error('expected an offer')
  const body = JSON.parse(paymentBody(d.offer, 'Tempo', { type: 'card', provider: 'p', token: 't' }, 'https://a.example/r').toString())
  t.same(body, { method: 'Tempo', amount: { value: '0.250', currency: 'usd' }, authorization: { type: 'card', provider: 'p', token: 't' }, resource: 'https://a.example/r' })
})

t.test('sessions: expiry from the header (seconds or a date), else the offer, else the default; token sanity', async (t) => {
  const now = Date.parse('2026-11-21T12:00:00Z')
  t.equal(sessionExpiry({ 'x-mpp-session-expires': '90' }, null, now, 3600), now + 90_000)
  t.equal(sessionExpiry({ 'x-mpp-session-expires': 'Sat, 21 Nov 2026 13:00:00 GMT' }, null, now, 3600), now + 3_600_000)
  t.equal(sessionExpiry({ 'x-mpp-session-expires': '2026-11-21T12:30:00Z' }, null, now, 3600), now + 1_800_000)
  t.equal(sessionExpiry({}, { sessionTtlSeconds: 600 }, now, 3600), now + 600_000)
  t.equal(sessionExpiry({ 'x-mpp-session-expires': 'garbage' }, null, now, 3600), now + 3_600_000)
  t.equal(sessionToken({ 'x-mpp-session': 'sess_abc' }), 'sess_abc')
  t.equal(sessionToken({ 'x-mpp-session': 'bad token\r\n' }), null)
  t.equal(sessionToken({}), null)
})

t.test('pickProtocol: the preference table', async (t) => {
  const table: [string, ('x402' | 'mpp')[], string | null][] = [
    ['auto', ['x402', 'mpp'], 'x402'],
    ['auto', ['mpp'], 'mpp'],
    ['x402', ['x402', 'mpp'], 'x402'],
    ['x402', ['mpp'], 'mpp'],
    ['mpp', ['x402', 'mpp'], 'mpp'],
    ['mpp', ['x402'], 'x402'],
    ['mpp', [], null],
  ]
  for (const [pref, payable, want] of table) t.equal(pickProtocol(pref as 'auto', payable), want, `${pref} with ${payable.join('+') || 'nothing'}`)
})

t.test('errors are PaygateErrors with the protocol code', async (t) => {
  t.throws(() => toBaseUnits('x', 'USD'), PaygateError)
})
