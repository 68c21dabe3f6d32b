import { Worker, type WorkerOptions } from 'node:worker_threads'

/**
 * A worker thread running the module `name` beside `from` (the caller's `import.meta.url`), as
 * built (`.js`) or from source (`.ts`, when the caller itself runs from source, as the tests
 * do). A worker does not inherit the `--import=tsx` hooks of its parent on Node 20, so a source
 * module is loaded through tsx's API registered inside the thread first.
 */
export function moduleThread(from: string, name: string, opts: WorkerOptions = {}): Worker {
  const source = from.endsWith('.ts')
  const entry = new URL(`./${name}${source ? '.ts' : '.js'}`, from)
  if (!source) return new Worker(entry, opts)
  const tsx = import.meta.resolve('tsx/esm/api')
  const boot = `import(${JSON.stringify(tsx)}).then((tsx) => { tsx.register(); return import(${JSON.stringify(entry.href)}) })`
  return new Worker(boot, { ...opts, eval: true })
}
