#!/usr/bin/env node
/**
 * The server as one file, `dist/paygate.js`, bundled by esbuild from what tsc built in `dist/`:
 * Node imports one module instead of some 1,200 (ours and the packages'), which takes about
 * 0.4 s against 1.0 s, on every start and on every restart after a crash. `npm run demo`'s
 * program (which runs a gateway in its own process) is bundled the same way, as `dist/demo.js`.
 *
 * - Packages with native addons or optional native parts stay outside (`EXTERNAL`), loaded
 *   from node_modules as before.
 * - A module's `import.meta.url` is rewritten to its own file in `dist/`, so what it finds
 *   beside itself (the default config, the dashboard, the OpenAPI document, a worker thread's
 *   module, a package through `createRequire`) is found as before. Worker threads run the
 *   unbundled modules in `dist/`.
 * - Nothing is done when the bundle is newer than every file it is made from (`npm start`
 *   runs the build each time).
 */
import { readdirSync, readFileSync, statSync } from 'node:fs'
import { join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL('..', import.meta.url))
const DIST = join(ROOT, 'dist')
/** Each bundle (in dist/, beside the modules it is made from) and its entry module. */
const ENTRIES = { paygate: join(DIST, 'main.js'), demo: join(DIST, 'demo', 'main.js') }
const OUTS = Object.keys(ENTRIES).map((name) => join(DIST, `${name}.js`))
// Native addons (found through __dirname, which a bundle has not), optional native parts, and pino (its transports are worker files of its own).
const EXTERNAL = ['classic-level', 'level', 'secp256k1', 'keccak', 'bufferutil', 'utf-8-validate', 'pg', 'pg-native', 'pino']

/** Newest mtime of the bundle's inputs: the built modules (not the dashboard), this script and the lockfile. */
function newestInput() {
  let newest = Math.max(statSync(fileURLToPath(import.meta.url)).mtimeMs, statSync(join(ROOT, 'package-lock.json')).mtimeMs)
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name)
      if (e.isDirectory()) {
        if (p !== join(DIST, 'web')) walk(p)
      } else if (p.endsWith('.js') && !OUTS.includes(p)) newest = Math.max(newest, statSync(p).mtimeMs)
    }
  }
  walk(DIST)
  return newest
}

function upToDate() {
  try {
    return Math.min(...OUTS.map((o) => statSync(o).mtimeMs)) >= newestInput()
  } catch {
    return false
  }
}

/** `import.meta.url` in a module of dist/ becomes that module's own URL, relative to the bundle. */
const ownUrl = {
  name: 'own-import-meta-url',
  setup(build) {
    build.onLoad({ filter: /\.js$/ }, (args) => {
      if (!args.path.startsWith(DIST)) return undefined
      const text = readFileSync(args.path, 'utf8')
      if (!text.includes('import.meta.url')) return { contents: text, loader: 'js' }
      const rel = `./${relative(DIST, args.path).split('\\').join('/')}`
      return { contents: text.replaceAll('import.meta.url', `new URL(${JSON.stringify(rel)}, import.meta.url).href`), loader: 'js' }
    })
  },
}

if (!upToDate()) {
  const { build } = await import('esbuild')
  await build({
    entryPoints: ENTRIES,
    outdir: DIST,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    external: EXTERNAL,
    // Packages bundled from CommonJS call require() for Node's built-ins.
    banner: { js: "import { createRequire as __paygateRequire } from 'node:module'; const require = __paygateRequire(import.meta.url);" },
    plugins: [ownUrl],
    logLevel: 'warning',
    legalComments: 'none',
    // Composed with tsc's own maps: `node --enable-source-maps dist/paygate.js` gives stack traces in src/*.ts.
    sourcemap: 'linked',
  })
}
