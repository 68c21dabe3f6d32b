/**
 * `npm run bench [name...]`: every benchmark prints its figures as ratios against a
 * baseline measured in the same run. Loads are bounded in count and time; loopback only.
 */
import { benchPay } from './pay.js'

const benches: Record<string, () => Promise<void>> = {
  pay: () => benchPay({ sequential: 2000, concurrent: 20_000, maxMs: 20_000 }),
}

const wanted = process.argv.slice(2).filter((a) => !a.startsWith('-'))
for (const name of wanted.length ? wanted : Object.keys(benches)) {
  const b = benches[name]
  if (!b) {
    console.error(`unknown benchmark ${name}; known: ${Object.keys(benches).join(', ')}`)
    process.exit(2)
  }
  console.log(`\n# ${name}`)
  await b()
}
