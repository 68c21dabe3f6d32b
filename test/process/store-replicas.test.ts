import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import pg from 'pg'
import { Store } from '../../src/store/index.js'
import { testDatabase } from '../helpers/postgres.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const PROCESSES = 3
const EACH = 200
const LANES = 4 // concurrent transact() callers inside each process

/**
 * A separate Node process on the same database: opens the store (migrating if it comes
 * first), then increments counter `n` EACH times through transact('n'), LANES callers at a
 * time, each read-modify-write yielding between its read and its write. Prints the values
 * its increments produced.
 */
const WORKER = `
  import { Store } from './src/store/index.ts'
  const [url, each, lanes] = [process.argv[1], Number(process.argv[2]), Number(process.argv[3])]
  const store = await Store.open('/nonexistent-unused', { postgresUrl: url, postgresPoolSize: 4 })
  const counters = store.collection('counters')
  const got = []
  let left = each
  const lane = async () => {
    while (left > 0) {
      left--
      const { result, written } = await store.transact('n', async () => {
        const n = (await counters.get('n')) ?? 0
        await new Promise((r) => setTimeout(r, Math.random() * 2))
        return { ops: [{ type: 'put', coll: counters, key: 'n', value: n + 1 }], result: n + 1 }
      })
      const w = await written
      if (!w.ok) throw w.error
      got.push(result)
    }
  }
  await Promise.all(Array.from({ length: lanes }, lane))
  await store.close()
  process.stdout.write(JSON.stringify(got) + '\\n')`

function worker(url: string): Promise<{ code: number | null; values: number[]; stderr: string }> {
  const p = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', WORKER, url, String(EACH), String(LANES)], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  let err = ''
  p.stdout.on('data', (d: Buffer) => (out += d))
  p.stderr.on('data', (d: Buffer) => (err += d))
  // Bounded: a worker that hangs is ended (by its own pid) and fails the test.
  const timer = setTimeout(() => p.kill('SIGKILL'), 180_000)
  return new Promise((resolve) =>
    p.on('exit', (code) => {
      clearTimeout(timer)
      let values: number[] = []
      try {
        values = JSON.parse(out.trim().split('\n').pop() ?? '[]') as number[]
      } catch {
        /* reported through code and stderr */
      }
      resolve({ code, values, stderr: err })
    }),
  )
}

t.test(`${PROCESSES} processes x ${EACH} transact() increments of one key on one database: none lost`, async (t) => {
  const url = await testDatabase()
  // All start together on an empty database: they also race to migrate it.
  const results = await Promise.all(Array.from({ length: PROCESSES }, () => worker(url)))
  for (const [i, r] of results.entries()) {
    t.equal(r.code, 0, `worker ${i} exited cleanly${r.stderr ? `: ${r.stderr}` : ''}`)
    t.equal(r.values.length, EACH, `worker ${i} made its ${EACH} increments`)
  }
  const store = await Store.open('/nonexistent-unused', { postgresUrl: url })
  t.teardown(() => store.close())
  t.equal(await store.collection<number>('counters').get('n'), PROCESSES * EACH, 'the counter holds every increment')
  const all = results.flatMap((r) => r.values).sort((a, b) => a - b)
  t.same(
    all,
    Array.from({ length: PROCESSES * EACH }, (_, i) => i + 1),
    'each increment read the one before it: every value from 1 to the total produced exactly once',
  )
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  t.teardown(() => c.end())
  const { rows } = await c.query<{ version: number }>('SELECT version FROM paygate_migrations ORDER BY version')
  t.same(
    rows.map((r) => r.version),
    [1],
    'migrated once, though every process opened it at the same time',
  )
})
