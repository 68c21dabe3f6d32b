import t from 'tap'
import { Challenge } from 'mppx'
import { getAddress, keccak256, toHex } from 'viem'
import { detectPaymentAuth, evmAuthorization, problemCode, readReceipt, splitChallenges } from '../../src/protocols/payment-auth.js'
import type { PayableChain } from '../../src/protocols/types.js'

const chain: PayableChain = { chainId: 31337, networkName: 'paygate-devnet', token: getAddress('0x5fbdb2315678afecb367f032d93f642f64180aa3'), tokenDomain: { name: 'USD Coin', version: '2' } }
const recipient = getAddress(`0x${'b7'.repeat(20)}`)
const now = Date.parse('2026-11-21T12:00:00Z')
const future = new Date(now + 300_000).toISOString()
const challenge = (method: string, intent: string, request: Record<string, unknown>, extra: Record<string, string> = {}) =>
  Challenge.serialize(Challenge.from({ id: `id-${method}-${intent}`, realm: 'shop.test', method, intent, request, expires: future, ...extra } as never))
const evmReq = { amount: '250000', currency: chain.token, recipient, methodDetails: { chainId: 31337, credentialTypes: ['authorization'], decimals: 6 } }
const stripeReq = { amount: '50', currency: 'usd', methodDetails: { networkId: 'internal', paymentMethodTypes: ['card'] } }
const answer = (...values: string[]) => ({ status: 402, headers: { 'www-authenticate': values.length === 1 ? values[0] : values }, body: Buffer.alloc(0) })

t.test('splitChallenges never splits inside quoted strings', async (t) => {
  t.same(splitChallenges('Payment id="a,b", realm="x, Payment y", method="evm", Basic realm="r", Payment id="c"'), [
    'Payment id="a,b", realm="x, Payment y", method="evm"',
    'Basic realm="r"',
    'Payment id="c"',
  ])
  t.same(splitChallenges('Bearer, Payment id="z"'), ['Bearer', 'Payment id="z"'])
  t.same(splitChallenges('Payment id="q\\"uote, still", method="evm"'), ['Payment id="q\\"uote, still", method="evm"'])
})

t.test('detectPaymentAuth: several offers in one header; unsupported, foreign and broken ones are skipped with a reason', async (t) => {
  const header = [
    challenge('evm', 'charge', evmReq, { description: 'one, two' }),
    challenge('stripe', 'charge', stripeReq),
    challenge('tempo', 'charge', { amount: '1' }),
    challenge('evm', 'session', evmReq),
    challenge('evm', 'charge', { ...evmReq, methodDetails: { chainId: 1 } }),
  ].join(', ')
  const d = detectPaymentAuth(answer(header, 'Payment id="broken"'), chain, { nowMs: now, canCard: true })
  t.equal(d.present, true)
  t.same(
    d.offers.map((o) => `${o.kind}:${o.amount}`),
    ['evm:250000', 'stripe:500000'],
  )
  t.match(d.skipped.join('\n'), /tempo\/charge is not supported/)
  t.match(d.skipped.join('\n'), /evm\/session is not supported/)
  t.match(d.skipped.join('\n'), /chainId 1 is not 31337/)
  t.match(d.skipped.join('\n'), /unreadable Payment challenge/)
  const noCard = detectPaymentAuth(answer(header), chain, { nowMs: now, canCard: false })
  t.same(
    noCard.offers.map((o) => o.kind),
    ['evm'],
    'stripe needs a card provider',
  )
  t.equal(detectPaymentAuth({ status: 402, headers: { 'www-authenticate': 'Basic realm="x"' }, body: Buffer.alloc(0) }, chain, { nowMs: now, canCard: true }).present, false)
})

t.test('an expired challenge is counted, never offered', async (t) => {
  const stale = Challenge.serialize(Challenge.from({ id: 'old', realm: 'shop.test', method: 'evm', intent: 'charge', request: evmReq, expires: new Date(now - 1).toISOString() } as never))
  const d = detectPaymentAuth(answer(stale), chain, { nowMs: now, canCard: true })
  t.equal(d.offers.length, 0)
  t.equal(d.expired, 1)
})

t.test('evmAuthorization binds the nonce to the challenge and expires with it', async (t) => {
  const d = detectPaymentAuth(answer(challenge('evm', 'charge', evmReq)), chain, { nowMs: now, canCard: false })
  const offer = d.offers[0]!
  if (offer.kind !== 'evm') throw new Error('expected evm')
  const a = evmAuthorization(offer, getAddress(`0x${'11'.repeat(20)}`), now)
  t.equal(a.nonce, keccak256(toHex('id-evm-chargeshop.test')))
  t.equal(a.validBefore, BigInt(Math.floor((now + 300_000) / 1000)))
  t.equal(a.value, 250_000n)
  t.equal(a.to, recipient)
})

t.test('problems map to the spec codes; receipts are read', async (t) => {
  const p = (type: string) => problemCode(Buffer.from(JSON.stringify({ type: `https://paymentauth.org/problems/${type}`, detail: 'x' })))?.code
  t.equal(p('verification-failed'), 'payment_failed')
  t.equal(p('payment-expired'), 'payment_failed')
  t.equal(p('payment-insufficient'), 'payment_failed', 'the target found the amount short: not the wallet')
  t.equal(p('bad-request'), 'payment_protocol_error')
  t.equal(p('malformed-credential'), 'payment_protocol_error')
  t.equal(p('invalid-challenge'), 'payment_protocol_error')
  t.equal(p('method-unsupported'), 'no_payable_offer')
  t.equal(problemCode(Buffer.from('{"type":"about:blank"}')), null)
  t.equal(problemCode(Buffer.from('nope')), null)
  const receipt = Buffer.from(JSON.stringify({ method: 'evm', reference: '0xabc', status: 'success', timestamp: '2026-11-21T12:00:00Z' })).toString('base64url')
  t.match(readReceipt({ 'payment-receipt': receipt }, 'eip155:31337'), { success: true, transaction: '0xabc', network: 'eip155:31337' })
  t.equal(readReceipt({ 'payment-receipt': '!!!' }, null), null)
})
