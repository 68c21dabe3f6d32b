import t from 'tap'
import { formatUnits, parseDecimal, toUsdcNumber, AmountError } from '../../src/util/money.js'

t.test('parseDecimal reads numbers and strings exactly', async (t) => {
  const cases: [number | string, bigint][] = [
    [0.1, 100000n],
    [0.01, 10000n],
    [10, 10000000n],
    ['10.50', 10500000n],
    [0.000001, 1n],
    [1e-6, 1n],
    [1.1e3, 1100000000n],
    ['123456789.123456', 123456789123456n],
    [0, 0n],
    ['.5', 500000n],
    ['5.', 5000000n],
  ]
  for (const [input, units] of cases) t.equal(parseDecimal(input), units, `${input}`)
})

t.test('parseDecimal rejects bad amounts', async (t) => {
  for (const bad of [1e-7, 0.1234567, -1, '-0.5', 'abc', '', '1.2.3', NaN, Infinity, '1e99', '0x10']) {
    t.throws(() => parseDecimal(bad as number | string), AmountError, `rejects ${JSON.stringify(String(bad))}`)
  }
})

t.test('formatUnits and toUsdcNumber round-trip', async (t) => {
  t.equal(formatUnits(1n), '0.000001')
  t.equal(formatUnits(10500000n), '10.5')
  t.equal(formatUnits(0n), '0')
  t.equal(formatUnits(-2500000n), '-2.5')
  t.equal(toUsdcNumber(100000n), 0.1)
  for (const u of [1n, 7n, 123456n, 999999999999n, 10n ** 18n]) t.equal(parseDecimal(toUsdcNumber(u)), u, `${u}`)
})
