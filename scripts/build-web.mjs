// Build the dashboard (web/) into dist/web with Vite, unless the build is newer than every
// source file: `npm start` runs this each time and a start after no change costs no rebuild.
import { existsSync, readdirSync, renameSync, rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const webDir = join(root, 'web')
const outDir = join(root, 'dist', 'web')
const stamp = join(outDir, 'index.html')
const tmpDir = join(root, 'dist', `.web-${process.pid}`)

function newest(path) {
  const st = statSync(path)
  if (!st.isDirectory()) return st.mtimeMs
  let m = st.mtimeMs
  for (const e of readdirSync(path)) m = Math.max(m, newest(join(path, e)))
  return m
}

// Status lines go to stderr: `npm start --silent -- ca > ca.pem` runs this build first, and its stdout is the PEM.
const sources = [webDir, join(root, 'scripts', 'build-web.mjs'), join(root, 'package-lock.json')]
const force = process.argv.includes('--force')
if (!force && existsSync(stamp) && statSync(stamp).mtimeMs >= Math.max(...sources.map(newest))) {
  console.error('dashboard: up to date (dist/web)')
  process.exit(0)
}

let build
try {
  ;({ build } = await import('vite'))
} catch {
  // A production install (npm ci --omit=dev) has no Vite: start without rebuilding.
  console.warn(existsSync(stamp) ? 'dashboard: Vite is not installed; serving the existing build' : 'dashboard: Vite is not installed and dist/web is not built; /ui/ will answer 404')
  process.exit(0)
}
await build({
  root: webDir,
  base: '/ui/',
  logLevel: 'warn',
  configFile: false,
  publicDir: false,
  // Preact's automatic JSX runtime (the web tsconfig says the same for type checking).
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: tmpDir,
    emptyOutDir: true,
    // No data: URLs (the CSP allows only 'self') and no inline preload polyfill.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    sourcemap: false,
    target: 'es2022',
    reportCompressedSize: false,
  },
})
// Swapped in whole: a gateway or a second build running at the same time never sees a half-emptied dist/web.
rmSync(outDir, { recursive: true, force: true })
renameSync(tmpDir, outDir)
console.error('dashboard: built into dist/web')
