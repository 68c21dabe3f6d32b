import t from 'tap'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'

t.test('committed contract artifacts match the Solidity sources', async (t) => {
  const root = fileURLToPath(new URL('../..', import.meta.url))
  const r = spawnSync(process.execPath, ['scripts/build-contracts.mjs', '--check'], { cwd: root, encoding: 'utf8' })
  t.equal(r.status, 0, r.stdout + r.stderr)
})
