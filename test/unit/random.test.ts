import t from 'tap'
import { randomBase62, randomHex } from '../../src/util/random.js'

t.test('randomHex: the asked length, hex, no repeats across several pool refills', async (t) => {
  const seen = new Set<string>()
  // 32 bytes each: 4,000 values use the 8 KB pool ~16 times over.
  for (let i = 0; i < 4000; i++) {
    const h = randomHex(32)
    if (!/^[0-9a-f]{64}$/.test(h)) t.fail(`not 64 hex digits: ${h}`)
    seen.add(h)
  }
  t.equal(seen.size, 4000, 'every value distinct')
  // sizes that do not divide the pool, and one larger than it
  for (const n of [1, 7, 31, 33, 1000, 8192, 8193, 20_000]) t.match(randomHex(n), new RegExp(`^[0-9a-f]{${2 * n}}$`), `${n} bytes`)
  t.equal(randomHex(0), '')
})

t.test('randomBase62: the asked length and alphabet, unbiased', async (t) => {
  for (const n of [0, 1, 10, 16, 40, 128]) t.match(randomBase62(n), new RegExp(`^[0-9A-Za-z]{${n}}$`), `${n} characters`)
  const ids = new Set<string>()
  for (let i = 0; i < 5000; i++) ids.add(randomBase62(10))
  t.equal(ids.size, 5000, 'no repeats')

  // Each symbol should show up 1/62 of the time. With modulo bias (bytes 248-255 kept) the
  // first 8 symbols would come out ~25% more often than the others (5 chances in 256 vs 4).
  const counts = new Map<string, number>()
  const N = 620_000
  const s = randomBase62(N)
  for (const c of s) counts.set(c, (counts.get(c) ?? 0) + 1)
  t.equal(counts.size, 62, 'every symbol appears')
  const expected = N / 62
  let chi2 = 0
  for (const n of counts.values()) chi2 += (n - expected) ** 2 / expected
  // 61 degrees of freedom: p = 1e-6 is at chi2 ~ 130; a modulo-biased draw gives ~4,000.
  t.ok(chi2 < 130, `chi-square ${chi2.toFixed(1)} is within what chance allows`)
  const low = ['0', '1', '2', '3', '4', '5', '6', '7'].reduce((a, c) => a + (counts.get(c) ?? 0), 0) / 8
  t.ok(Math.abs(low / expected - 1) < 0.03, `the first 8 symbols are not favoured (${(low / expected).toFixed(3)})`)
})
