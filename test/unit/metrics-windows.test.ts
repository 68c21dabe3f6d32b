import t from 'tap'
import { PaygateError } from '../../src/errors/index.js'
import { latencyIndex, latencyValue, quantile } from '../../src/metrics/buckets.js'
import { bucketStarts, DAY_MS, HOUR_MS, MINUTE_MS, precisionOf, resolveWindow, seriesStarts, spanEnd, stepOf } from '../../src/metrics/windows.js'
import { ManualClock } from '../../src/util/clock.js'

/** Window arithmetic, pure, on a clock moved by hand. */
const clock = new ManualClock(Date.parse('2026-03-10T12:34:56.789Z'))
const now = clock.now()

t.test('named windows: exact to the minute up to 24 h, to the hour beyond; widened at the start', async (t) => {
  const h1 = resolveWindow({ window: '1h' }, now)
  t.equal(h1.precision, 'minute')
  t.equal(new Date(h1.from).toISOString(), '2026-03-10T11:34:00.000Z')
  t.equal(new Date(h1.last).toISOString(), '2026-03-10T12:34:00.000Z')
  t.equal(bucketStarts(h1).length, 61)
  const d1 = resolveWindow({}, now)
  t.equal(d1.precision, 'minute', 'the default window is 24h, to the minute')
  t.equal(d1.from, Date.parse('2026-03-09T12:34:00Z'))
  const d7 = resolveWindow({ window: '7d' }, now)
  t.equal(d7.precision, 'hour')
  t.equal(new Date(d7.from).toISOString(), '2026-03-03T12:00:00.000Z')
  t.equal(new Date(d7.last).toISOString(), '2026-03-10T12:00:00.000Z')
  t.equal(bucketStarts(d7).length, 7 * 24 + 1)
  t.equal(resolveWindow({ window: '30d' }, now).precision, 'hour')
})

t.test('from/to: precision by length and by what minute buckets are still kept (48 h)', async (t) => {
  const recent = resolveWindow({ from: '2026-03-10T10:00:30Z', to: '2026-03-10T11:00:00Z' }, now)
  t.equal(recent.precision, 'minute')
  t.equal(recent.from, Date.parse('2026-03-10T10:00:00Z'))
  t.equal(recent.last, Date.parse('2026-03-10T10:59:00Z'), 'to is exclusive: the bucket it starts is not read')
  t.equal(spanEnd(recent, now), Date.parse('2026-03-10T11:00:00Z'))
  const old = resolveWindow({ from: '2026-03-01T10:00:00Z', to: '2026-03-01T11:00:00Z' }, now)
  t.equal(old.precision, 'hour', 'minute buckets of 9 days ago are gone')
  t.same(bucketStarts(old), [Date.parse('2026-03-01T10:00:00Z')], 'an hour on the hour: one hour bucket')
  t.equal(spanEnd(old, now), Date.parse('2026-03-01T11:00:00Z'))
  const ragged = resolveWindow({ from: '2026-03-01T10:20:00Z', to: '2026-03-01T11:10:00Z' }, now)
  t.same([ragged.from, spanEnd(ragged, now)], [Date.parse('2026-03-01T10:00:00Z'), Date.parse('2026-03-01T12:00:00Z')], 'widened to whole hours at both ends')
  t.equal(precisionOf(now - 48 * HOUR_MS + MINUTE_MS, now - 47 * HOUR_MS, now), 'minute')
  t.equal(precisionOf(now - 49 * HOUR_MS, now - 47 * HOUR_MS, now), 'hour')
  const open = resolveWindow({ from: '2026-03-10T12:00:00Z' }, now)
  t.equal(open.last, Date.parse('2026-03-10T12:34:00Z'), 'to defaults to now')
  t.equal(spanEnd(open, now), now, 'a span reaching now counts up to now')
  t.equal(spanEnd(resolveWindow({ window: '7d' }, now), now), now)
})

t.test('bad windows: 400 naming the field; unknown ones list the allowed values', async (t) => {
  const fails = (q: Parameters<typeof resolveWindow>[0], field: string) => {
    try {
      resolveWindow(q, now)
      t.fail(`accepted ${JSON.stringify(q)}`)
      return null
    } catch (e) {
      t.type(e, PaygateError)
      const err = e as PaygateError
      t.equal(err.status, 400)
      t.equal(err.extra.field, field, JSON.stringify(q))
      return err
    }
  }
  const unknown = fails({ window: '2d' }, 'window')
  t.same(unknown?.extra.allowed, ['1h', '24h', '7d', '30d'])
  t.match(unknown?.detail, /1h, 24h, 7d, 30d/)
  fails({ window: '7d', from: '2026-03-01T00:00:00Z' }, 'window')
  fails({ from: 'yesterday' }, 'from')
  fails({ from: '2026-03-01T00:00:00Z', to: '1741600000' }, 'to')
  fails({ to: '2026-03-01T00:00:00Z' }, 'from')
  fails({ from: '2026-03-02T00:00:00Z', to: '2026-03-01T00:00:00Z' }, 'from')
  fails({ window: 'toString' }, 'window')
})

t.test('series steps: minutes up to 2 h, hours up to 3 days, days beyond', async (t) => {
  t.equal(stepOf(HOUR_MS), MINUTE_MS)
  t.equal(stepOf(DAY_MS), HOUR_MS)
  t.equal(stepOf(7 * DAY_MS), DAY_MS)
  const d1 = resolveWindow({ window: '24h' }, now)
  const points = seriesStarts(d1)
  t.equal(points.length, 25)
  t.equal(points[0], Date.parse('2026-03-09T12:00:00Z'))
  t.equal(seriesStarts(resolveWindow({ window: '30d' }, now)).length, 31)
})

t.test('latency histogram: log scale, four buckets a doubling, within 2^(1/8) of the truth', async (t) => {
  t.equal(latencyIndex(0), 0)
  t.equal(latencyIndex(0.99), 0)
  t.equal(latencyIndex(1), 1)
  t.equal(latencyIndex(2), 5)
  t.equal(latencyIndex(1e12), latencyIndex(2 ** 30), 'the last bucket is open-ended')
  for (const ms of [1, 1.7, 3, 12.5, 99, 250, 1000, 4321, 60_000]) {
    const v = latencyValue(latencyIndex(ms))
    t.ok(Math.abs(v - ms) / ms <= 2 ** (1 / 8) - 1 + 1e-12, `${ms} ms reported as ${v}`)
  }
  const hist: Record<number, number> = {}
  for (let ms = 1; ms <= 100; ms++) hist[latencyIndex(ms)] = (hist[latencyIndex(ms)] ?? 0) + 1
  const p50 = quantile(hist, 0.5)!
  const p95 = quantile(hist, 0.95)!
  t.ok(Math.abs(p50 - 50) / 50 <= 0.0906, `p50 ${p50}`)
  t.ok(Math.abs(p95 - 95) / 95 <= 0.0906, `p95 ${p95}`)
  t.equal(quantile({}, 0.5), null)
})
