#!/usr/bin/env node
// The `paygate` command (package.json "bin"): the built service when `npm run build` has made
// dist/, otherwise the TypeScript sources through tsx, as `npm start` runs them.
import { existsSync } from 'node:fs'

const built = new URL('../dist/paygate.js', import.meta.url)
if (existsSync(built)) {
  await import(built.href)
} else {
  const { register } = await import('tsx/esm/api')
  register()
  await import(new URL('../src/main.ts', import.meta.url).href)
}
