import t, { type Test } from 'tap'
import { execFileSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { testDir } from '../helpers/gateway.js'

/**
 * `.ci/summary.mjs`: CI's last lines. Only the tail of a run is read back, so a failure must
 * be named there, by its path of subtests and with its diagnostics, before the counts.
 */
const SCRIPT = fileURLToPath(new URL('../../.ci/summary.mjs', import.meta.url))

function summary(t: Test, log: string): string[] {
  const file = join(testDir(t), 'tap.log')
  writeFileSync(file, log)
  return execFileSync(process.execPath, [SCRIPT, file], { encoding: 'utf8' }).trimEnd().split('\n')
}

const failing = `# Subtest: test/a.test.ts
    # Subtest: one subtest
        ok 1 - fine
        not ok 2 - the count
          ---
          diff: |
            --- expected
            +++ actual
            -3
            +4
          at:
            fileName: test/a.test.ts
          ...
        1..2
    not ok 1 - one subtest # time=12.5ms
      ---
      at:
        fileName: test/a.test.ts
      ...
    1..1
    # time=40.1ms
not ok 1 - test/a.test.ts # time=40.1ms
  ---
  command: /usr/bin/node
  args:
    - test/a.test.ts
  exitCode: 1
  ...
# Subtest: test/b.test.ts
    ok 1 - fine
    1..1
ok 2 - test/b.test.ts # time=3ms

# { total: 3, pass: 2, fail: 1 }
`

t.test('a failure is named by its path, with its diagnostics; the counts come last', async (t) => {
  const out = summary(t, failing)
  t.equal(out.at(-1), '2 passed, 1 failed')
  t.equal(out[0], 'not ok: test/a.test.ts > one subtest > the count')
  t.ok(out.includes('    +4'), 'the diff is shown')
  const sub = out.indexOf('not ok: test/a.test.ts > one subtest')
  t.ok(sub > 0, 'the subtest that failed')
  t.equal(out[sub + 1], 'not ok: test/a.test.ts', 'without a location of its own (the failure in it has one); then the file')
  t.equal(out[sub + 2], '    exitCode: 1', 'with how it ended')
  t.notOk(out.includes('    command: /usr/bin/node'), 'not its command line')
  t.notOk(
    out.some((l) => l.includes('b.test.ts')),
    'what passed is not listed',
  )
})

t.test('a failure printed twice is listed once', async (t) => {
  const out = summary(t, failing.replace('# { total', `${failing.split('# {')[0]}# { total`))
  t.equal(out.filter((l) => l === 'not ok: test/a.test.ts > one subtest > the count').length, 1)
})

t.test('a clean run prints the counts alone; skipped and todo are counted; no summary is a failure', async (t) => {
  t.strictSame(summary(t, 'ok 1 - test/b.test.ts\n# { total: 5, pass: 5 }\n'), ['5 passed, 0 failed'])
  t.strictSame(summary(t, '# { total: 5, pass: 3, skip: 1, todo: 1 }\n'), ['2 skipped', '3 passed, 0 failed'])
  t.strictSame(summary(t, 'the runner died\n'), ['0 passed, 1 failed'])
})
