#!/usr/bin/env node
/**
 * Summarise a V8 `.cpuprofile` (from `BENCH_PROFILE=<dir> npm run bench pay`):
 *
 *   node scripts/cpuprofile.mjs <file> [top] [N]       self and inclusive ms by function and by file/package
 *   node scripts/cpuprofile.mjs <file> owners [dir]    busy time charged to the leaf-most frame in src/ (by file, or by folder)
 *   node scripts/cpuprofile.mjs <file> callers <text>  the stacks above functions whose name or file contains <text>
 *                                                     (6 frames each; DEPTH=<n> for more)
 *
 * Times are the profile's sample intervals: on a loaded machine they include moments the
 * process was not running, so compare shares within one profile rather than absolute ms.
 */
import { readFileSync } from 'node:fs'

const [file, mode = 'top', arg] = process.argv.slice(2)
if (!file) {
  console.error('usage: node scripts/cpuprofile.mjs <file.cpuprofile> [top [N] | owners [dir] | callers <text>]')
  process.exit(2)
}
const profile = JSON.parse(readFileSync(file, 'utf8'))
const byId = new Map(profile.nodes.map((n) => [n.id, n]))
const parentOf = new Map()
for (const n of profile.nodes) for (const c of n.children ?? []) parentOf.set(c, n.id)

const short = (url) => (url || '').replace(/^file:\/\//, '').replace(/.*node_modules\//, 'nm:')
// The built tree (dist/, as `npm start` and the benchmarks run) counts as src/.
const srcPath = (url) => {
  const m = /node_modules/.test(url || '') ? null : /\/(?:src|dist)\/(.*)$/.exec(url || '')
  return m ? `src/${m[1]}` : undefined
}
const srcish = (u) => u.replace(/^(?!nm:).*\/(?:src|dist)\//, 'src/')
const fnKey = (n) => `${n.callFrame.functionName || '(anon)'} ${srcish(short(n.callFrame.url))}:${n.callFrame.lineNumber + 1}`
const fileKey = (n) => {
  const u = srcish(short(n.callFrame.url))
  if (!u) return `(${n.callFrame.functionName})`
  return /^nm:((@[^/]+\/)?[^/]+)/.exec(u)?.[0] ?? u
}
const IDLE = new Set(['(idle)'])

/** Every sample: its duration (ms) and its stack, leaf first. */
function* samples() {
  const { samples: ids, timeDeltas } = profile
  for (let i = 0; i < ids.length; i++) {
    const stack = []
    for (let id = ids[i]; id !== undefined; id = parentOf.get(id)) stack.push(byId.get(id))
    yield { ms: (timeDeltas[i + 1] ?? timeDeltas[i]) / 1000, stack }
  }
}

const add = (m, k, v) => m.set(k, (m.get(k) ?? 0) + v)
function print(title, m, total, n = 30) {
  console.log(`\n## ${title}`)
  for (const [k, v] of [...m].sort((a, b) => b[1] - a[1]).slice(0, n)) console.log(`${v.toFixed(0).padStart(8)} ms ${((100 * v) / total).toFixed(1).padStart(5)}%  ${k}`)
}

if (mode === 'top') {
  const n = Number(arg ?? 30)
  const self = new Map()
  const incl = new Map()
  const fself = new Map()
  const fincl = new Map()
  let total = 0
  for (const { ms, stack } of samples()) {
    total += ms
    add(self, fnKey(stack[0]), ms)
    add(fself, fileKey(stack[0]), ms)
    // Recursion counts once per sample.
    for (const k of new Set(stack.map(fnKey))) add(incl, k, ms)
    for (const k of new Set(stack.map(fileKey))) add(fincl, k, ms)
  }
  console.log(`sampled ${total.toFixed(0)} ms`)
  print('self, by function', self, total, n)
  print('inclusive, by function', incl, total, n)
  print('self, by file or package', fself, total, n)
  print('inclusive, by file or package', fincl, total, n)
} else if (mode === 'owners') {
  const owners = new Map()
  let busy = 0
  for (const { ms, stack } of samples()) {
    if (IDLE.has(stack[0].callFrame.functionName)) continue
    busy += ms
    const own = stack.map((f) => srcPath(f.callFrame.url)).find(Boolean)
    const leaf = stack[0].callFrame
    const other = ['(garbage collector)', '(program)'].includes(leaf.functionName)
      ? leaf.functionName
      : /node_modules\/(tsx|esbuild)|modules\/esm/.test(leaf.url)
        ? '(module loading)'
        : '(no src/ frame: Node and package internals, e.g. socket writes, HTTP parsing)'
    add(owners, own ? (arg === 'dir' ? own.split('/').slice(0, 2).join('/') : own) : other, ms)
  }
  console.log(`busy ${busy.toFixed(0)} ms (idle excluded), charged to the leaf-most src/ frame`)
  print('owners', owners, busy, 40)
} else if (mode === 'callers' && arg) {
  const paths = new Map()
  let total = 0
  for (const { ms, stack } of samples()) {
    const at = stack.findIndex((f) => fnKey(f).includes(arg))
    if (at < 0) continue
    total += ms
    add(
      paths,
      stack
        .slice(at, at + Number(process.env.DEPTH ?? 6))
        .map(fnKey)
        .join('\n      <- '),
      ms,
    )
  }
  console.log(`${total.toFixed(0)} ms under ${arg}`)
  print('stacks', paths, total, 15)
} else {
  console.error(`unknown mode ${mode}`)
  process.exit(2)
}
