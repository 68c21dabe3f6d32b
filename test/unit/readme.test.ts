import t from 'tap'
import { readFileSync } from 'node:fs'
import { KEYS, envName, flagName } from '../../src/config/keys.js'

const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8')

t.test('the README documents every configuration key', async (t) => {
  for (const k of KEYS) {
    t.ok(readme.includes(`\`${k.path}\``), `${k.path}`)
    t.ok(readme.includes(`\`${envName(k.path)}\``), envName(k.path))
    t.ok(readme.includes(`\`${flagName(k.path)}\``), flagName(k.path))
  }
})

t.test('the README shows the two commands', async (t) => {
  t.match(readme, /npm ci && npm start/)
  t.match(readme, /npm test/)
})
