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

/** The anchors GitHub gives a Markdown file's headings (fenced code skipped; a repeated one gets -1, -2, ...). */
function anchorsOf(text: string): Set<string> {
  const out = new Set<string>()
  let fenced = false
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced
    const h = fenced ? null : /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)
    if (!h) continue
    const base = h[1]!
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-')
    let slug = base
    for (let i = 1; out.has(slug); i++) slug = `${base}-${i}`
    out.add(slug)
  }
  return out
}

t.test('every relative link in the README and docs/ points at a file that exists, and at a heading it has', async (t) => {
  const files = [
    'README.md',
    ...readdirSync(new URL('docs/', root))
      .filter((f) => f.endsWith('.md'))
      .map((f) => `docs/${f}`),
  ]
  for (const f of files) {
    const text = readFileSync(new URL(f, root), 'utf8')
    for (const [, target, anchor] of text.matchAll(/\]\(([^)#\s]*)(?:#([^)\s]*))?\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue
      const file = new URL(target || '', new URL(f, root))
      if (!t.ok(existsSync(file), `${f} -> ${target}`) || !anchor || !file.pathname.endsWith('.md')) continue
      t.ok(anchorsOf(readFileSync(file, 'utf8')).has(anchor), `${f} -> ${target}#${anchor}`)
    }
  }
})
