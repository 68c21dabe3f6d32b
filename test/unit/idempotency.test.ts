import t from 'tap'
import { rmSync } from 'node:fs'
import { canonicalJson, Idempotency, nothingSigned, unreached } from '../../src/engine/idempotency.js'
import { PaygateError } from '../../src/errors/index.js'
import { Store } from '../../src/store/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { STORE_BACKENDS, tempDir, testStore } from '../helpers/gateway.js'

// On both store backends: the keys are state like any other.
for (const backend of STORE_BACKENDS) {
  t.test(`idempotency keys (${backend}): replay, conflict, expiry and sweep`, async (t) => {
    const { store } = await testStore(t, undefined, backend)
    const clock = new ManualClock()
    const idem = new Idempotency(store, clock, 60_000)
    let calls = 0
    const work = async () => ++calls
    t.equal(await idem.run('a', 'k1', 'h1', work), 1)
    t.equal(await idem.run('a', 'k1', 'h1', work), 1, 'replayed, not run again')
    t.equal(await idem.run('b', 'k1', 'h1', work), 2, 'keys are per agent')
    await t.rejects(idem.run('a', 'k1', 'other', work), { code: 'idempotency_conflict' })
    clock.advance(30_000)
    t.equal(await idem.run('a', 'k2', 'h2', work), 3)
    t.equal(await idem.sweep(), 0, 'nothing expired yet')
    clock.advance(30_001)
    t.equal(await idem.sweep(), 2, 'the two results older than the TTL are deleted')
    t.equal(await idem.run('a', 'k1', 'h1', work), 4, 'an expired key runs again')
    t.equal(await idem.run('a', 'k2', 'h2', work), 3, 'a live key still replays')
  })

  t.test(`idempotency keys (${backend}): which errors are kept`, async (t) => {
    const { store } = await testStore(t, undefined, backend)
    const idem = new Idempotency(store, new ManualClock(), 60_000)
    /** Fails with `err` on the first call, succeeds after; returns how many calls ran. */
    const flaky = (err: PaygateError) => {
      let calls = 0
      return {
        fn: async () => {
          if (++calls === 1) throw err
          return calls
        },
        calls: () => calls,
      }
    }
    const cases: [string, PaygateError, typeof unreached | undefined, 'kept' | 'runs again'][] = [
      ['the target down', new PaygateError('upstream_unreachable', 'refused'), undefined, 'runs again'],
      ['the target down (pay route)', new PaygateError('upstream_unreachable', 'refused'), nothingSigned, 'runs again'],
      ['an unreadable 402 (pay route)', new PaygateError('payment_protocol_error', 'no known shape'), nothingSigned, 'runs again'],
      ['an unreadable 402 (default: the proxy may raise it after paying)', new PaygateError('payment_protocol_error', 'too large'), undefined, 'kept'],
      ['a payment refused as malformed', new PaygateError('payment_protocol_error', 'malformed', { extra: { transactionId: 'tx_1' } }), nothingSigned, 'kept'],
      ['a failed payment (it may yet settle: never pay again)', new PaygateError('payment_failed', 'after 3 attempts', { extra: { transactionId: 'tx_2' } }), nothingSigned, 'kept'],
      ['a policy rejection', new PaygateError('policy_violation', 'blocked', { extra: { reason: 'domain_blocked' } }), nothingSigned, 'kept'],
      ['an internal error', new PaygateError('internal_error', 'oops'), nothingSigned, 'runs again'],
      ['the chain silent', new PaygateError('unavailable', 'chain'), undefined, 'runs again'],
    ]
    let n = 0
    for (const [what, err, unpaid, expect] of cases) {
      const key = `k${n++}`
      const f = flaky(err)
      await t.rejects(idem.run('a', key, 'h', f.fn, unpaid), { code: err.code }, what)
      if (expect === 'kept') {
        await t.rejects(idem.run('a', key, 'h', f.fn, unpaid), { code: err.code, detail: err.detail, extra: err.extra }, `${what}: replayed`)
        t.equal(f.calls(), 1, `${what}: not run again`)
      } else {
        t.equal(await idem.run('a', key, 'h', f.fn, unpaid), 2, `${what}: runs again`)
        t.equal(await idem.run('a', key, 'h', f.fn, unpaid), 2, `${what}: then its success is kept`)
      }
    }
  })
}

t.test('idempotency keys: a run cut off by a crash is recovered from what it recorded, never simply run again', async (t) => {
  const dir = tempDir()
  const clock = new ManualClock()
  let store = await Store.open(dir)
  t.teardown(async () => {
    await store.close()
    rmSync(dir, { recursive: true, force: true })
  })
  // The first process: the run starts (its marker is written before fn) and never ends.
  let started = false
  const first = new Idempotency(store, clock, 60_000)
  void first.run('a', 'k', 'h', () => {
    started = true
    return new Promise<number>(() => {})
  })
  while (!started) await new Promise((r) => setImmediate(r))
  const startedAt = clock.now()
  await store.close()

  // After the restart: the marker says the run was cut off; recover decides.
  clock.advance(5_000)
  store = await Store.open(dir)
  const idem = new Idempotency(store, clock, 60_000)
  let ran = 0
  const asked: number[] = []
  await t.rejects(
    idem.run(
      'a',
      'k',
      'h',
      async () => ++ran,
      unreached,
      async (at) => {
        asked.push(at)
        throw new PaygateError('unavailable', 'still settling')
      },
    ),
    { code: 'unavailable' },
    'still settling: retry later',
  )
  t.equal(
    await idem.run(
      'a',
      'k',
      'h',
      async () => ++ran,
      unreached,
      async () => 42,
    ),
    42,
    'recovered from the record',
  )
  t.equal(
    await idem.run(
      'a',
      'k',
      'h',
      async () => ++ran,
      unreached,
      async () => 7,
    ),
    42,
    'and kept: later calls replay it',
  )
  t.equal(ran, 0, 'the cut-off request never ran again')
  t.same(asked, [startedAt], 'recover is told when the cut-off run started')
  await t.rejects(
    idem.run('a', 'k', 'other', async () => ++ran),
    { code: 'idempotency_conflict' },
    'the marker holds the key for its request',
  )

  // Another cut-off run, of which nothing went out: it runs again.
  const other = new Idempotency(store, clock, 60_000)
  let hung = false
  void other.run('a', 'k2', 'h', () => {
    hung = true
    return new Promise<number>(() => {})
  })
  while (!hung) await new Promise((r) => setImmediate(r))
  const fresh = new Idempotency(store, clock, 60_000)
  t.equal(
    await fresh.run(
      'a',
      'k2',
      'h',
      async () => ++ran,
      unreached,
      async () => undefined,
    ),
    1,
    'recover found nothing: run again',
  )
  t.equal(await fresh.run('a', 'k2', 'h', async () => ++ran), 1, 'that result is kept')
})

t.test('canonical JSON: the same value in another key order is the same text', async (t) => {
  t.equal(canonicalJson({ b: 2, a: { d: [1, { z: 1, y: 2 }], c: null } }), canonicalJson({ a: { c: null, d: [1, { y: 2, z: 1 }] }, b: 2 }))
  t.equal(canonicalJson({ b: 2, a: 'x' }), '{"a":"x","b":2}')
  t.not(canonicalJson({ a: [1, 2] }), canonicalJson({ a: [2, 1] }), 'array order matters')
})
