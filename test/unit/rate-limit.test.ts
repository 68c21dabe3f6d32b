import t from 'tap'
import { TokenBucket } from '../../src/api/rate-limit.js'
import { ManualClock } from '../../src/util/clock.js'

t.test('token bucket: burst, then refill at the per-minute rate', async (t) => {
  const clock = new ManualClock()
  const b = new TokenBucket(60, 3, clock)
  t.same([b.take().ok, b.take().ok, b.take().ok], [true, true, true])
  const denied = b.take()
  t.same(denied, { ok: false, retryAfter: 1 })
  clock.advance(1000)
  t.ok(b.take().ok, 'one token per second at 60/min')
  t.notOk(b.take().ok)
  clock.advance(60_000)
  t.same([b.take().ok, b.take().ok, b.take().ok, b.take().ok], [true, true, true, false], 'refill capped at burst')
  const slow = new TokenBucket(1, 1, clock)
  slow.take()
  t.same(slow.take(), { ok: false, retryAfter: 60 })
})
