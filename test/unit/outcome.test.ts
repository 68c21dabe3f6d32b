import t from 'tap'
import { resend, servedEnd, unservedEnd, type EndState } from '../../src/engine/outcome.js'

/** How a payment ends, as a named table: each row is a case the engine meets. */
t.test('served answers', async (t) => {
  const rows: [string, Parameters<typeof servedEnd>[0], EndState][] = [
    ['off-chain proof served', { onChain: false, reported: false, used: null }, 'paid'],
    ['settlement reported by the target', { onChain: true, reported: true, used: null }, 'paid'],
    ['not reported, the chain shows it used', { onChain: true, reported: false, used: true }, 'paid'],
    ['not reported, unused on chain (it may settle later)', { onChain: true, reported: false, used: false }, 'held'],
    ['not reported, the chain cannot say', { onChain: true, reported: false, used: null }, 'held'],
  ]
  for (const [name, input, want] of rows) t.equal(servedEnd(input), want, name)
})

t.test('attempts that ended unserved (refused, 5xx, no answer)', async (t) => {
  const rows: [string, Parameters<typeof unservedEnd>[0], EndState][] = [
    ['used on chain after all', { used: true, expired: false }, 'paid'],
    ['used on chain, even past validBefore', { used: true, expired: true }, 'paid'],
    ['refused and unused, still valid: the target may still settle it', { used: false, expired: false }, 'held'],
    ['the chain cannot say', { used: null, expired: true }, 'held'],
    ['off-chain proof (no chain to ask), still valid', { used: null, expired: false }, 'held'],
    ['unused and expired', { used: false, expired: true }, 'failed'],
  ]
  for (const [name, input, want] of rows) t.equal(unservedEnd(input), want, name)
})

t.test('whether the same authorization is sent again', async (t) => {
  const base = { refused: false, onChain: true, used: false as boolean | null, msLeft: 60_000, attempt: 1, maxAttempts: 3, marginMs: 6_000 }
  const rows: [string, Partial<typeof base>, boolean][] = [
    ['a timeout or 5xx, unused, time left', {}, true],
    ['the chain cannot say after a timeout', { used: null }, true],
    ['refused and confirmed unused', { refused: true }, false],
    ['refused, the chain cannot say', { refused: true, used: null }, true],
    ['refused off-chain proof', { refused: true, onChain: false, used: null }, false],
    ['too close to expiry', { msLeft: 6_000 }, false],
    ['the last attempt', { attempt: 3 }, false],
  ]
  for (const [name, change, want] of rows) t.equal(resend({ ...base, ...change }), want, name)
})
