// The last lines of a CI run: each failure by its path of subtests with its first diagnostic
// lines (so the tail of the output names what failed), then tap's counts as "N passed, N failed".
import { readFileSync } from 'node:fs'

const text = readFileSync(process.argv[2], 'utf8')
const all = text.split('\n')
// tap's closing summary line: "# { total: N, pass: P, fail: F, ... }"
const last = all.filter((l) => /^# \{ total: \d+/.test(l)).pop()
if (!last) {
  console.log('0 passed, 1 failed')
  process.exit(0)
}
const num = (k) => Number((new RegExp(`${k}: (\\d+)`).exec(last) ?? [0, 0])[1])
const [passed, failed, skipped] = [num('pass'), num('fail'), num('skip') + num('todo')]

if (failed) {
  const path = []
  const shown = []
  for (let i = 0; i < all.length && shown.length < 10; i++) {
    const sub = /^( *)# Subtest: (.*)$/.exec(all[i])
    if (sub) {
      path.length = sub[1].length / 4
      path.push(sub[2])
      continue
    }
    const bad = /^( *)not ok \d+ - (.*?)(?: # time=[\d.]+m?s)?$/.exec(all[i])
    if (!bad) continue
    const entry = [`not ok: ${[...path.slice(0, bad[1].length / 4), bad[2]].join(' > ')}`]
    // A subtest that failed follows the plan ("1..N") of the tests in it: those say why.
    let k = i - 1
    while (k > 0 && !all[k].trim()) k--
    const file = bad[1] === ''
    if ((file || !/^ *1\.\.\d+/.test(all[k] ?? '')) && all[i + 1]?.trim() === '---') {
      for (let j = i + 2; j < i + (file ? 60 : 14) && j < all.length && all[j].trim() !== '...'; j++) {
        // A test file's own diagnostics are mostly its command line: keep how it ended.
        if (file && !/^ *(exitCode|signal|timeout|message|tapCaught):/.test(all[j])) continue
        entry.push(`    ${all[j].trim()}`)
      }
    }
    // tap may print a failing file's output twice.
    if (!shown.includes(entry.join('\n'))) shown.push(entry.join('\n'))
  }
  console.log(shown.join('\n'))
}
if (skipped) console.log(`${skipped} skipped`)
console.log(`${passed} passed, ${failed} failed`)
