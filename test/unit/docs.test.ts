import t from 'tap'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { KEYS, envName, flagName } from '../../src/config/keys.js'

const root = new URL('../../', import.meta.url)
const readme = readFileSync(new URL('README.md', root), 'utf8')
const configuration = readFileSync(new URL('docs/configuration.md', root), 'utf8')

t.test('docs/configuration.md documents every configuration key', async (t) => {
  for (const k of KEYS) {
    t.ok(configuration.includes(`\`${k.path}\``), `${k.path}`)
    t.ok(configuration.includes(`\`${envName(k.path)}\``), envName(k.path))
    t.ok(configuration.includes(`\`${flagName(k.path)}\``), flagName(k.path))
  }
})

t.test("the README shows the two commands and fits a newcomer's first ten minutes", async (t) => {
  t.match(readme, /npm ci && npm start/)
  t.match(readme, /npm test/)
  t.ok(readme.split('\n').length <= 200, 'at most 200 lines')
})

t.test('every relative link in the README and docs/ points at a file that exists', async (t) => {
  const files = [
    'README.md',
    ...readdirSync(new URL('docs/', root))
      .filter((f) => f.endsWith('.md'))
      .map((f) => `docs/${f}`),
  ]
  for (const f of files) {
    const text = readFileSync(new URL(f, root), 'utf8')
    for (const [, target] of text.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue
      t.ok(existsSync(new URL(target!, new URL(f, root))), `${f} -> ${target}`)
    }
  }
})
