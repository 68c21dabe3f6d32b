import t from 'tap'
import { rmSync } from 'node:fs'
import { Idempotency } from '../../src/engine/idempotency.js'
import { Store } from '../../src/store/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { tempDir } from '../helpers/gateway.js'

t.test('idempotency keys: replay, conflict, expiry and sweep', async (t) => {
  const dir = tempDir()
  const store = await Store.open(dir)
  t.teardown(async () => {
    await store.close()
    rmSync(dir, { recursive: true, force: true })
  })
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
