import t, { type Test } from 'tap'
import { spawnSync } from 'node:child_process'
import { crc32 } from 'node:zlib'
import { appendFileSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { type BatchOp, LevelStore } from '../../src/store/index.js'
import { testDir, testStore } from '../helpers/gateway.js'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))

/**
 * A process that opens the store in `dir`, puts `gone`, waits until LevelDB holds it, then logs
 * `n` batches (each puts `k<i>` and deletes `gone`) and SIGKILLs itself as soon as they are
 * acknowledged: LevelDB is written after the current tick, so only the log holds them.
 */
function crashAfterWrites(dir: string, n: number): { signal: string | null; stdout: string } {
  const script = `
    import { LevelStore } from './src/store/index.ts'
    const store = await LevelStore.open(process.argv[1])
    const c = store.collection('things')
    await store.batch([{ type: 'put', coll: c, key: 'gone', value: 'here' }])
    await store.settled()
    const writes = []
    for (let i = 0; i < ${n}; i++) writes.push(store.batch([{ type: 'put', coll: c, key: 'k' + i, value: { i } }, { type: 'del', coll: c, key: 'gone' }]))
    await Promise.all(writes)
    process.stdout.write('logged\\n')
    process.kill(process.pid, 'SIGKILL')`
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script, dir], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 })
  return { signal: r.signal, stdout: r.stdout }
}

const walFiles = (dir: string): string[] => readdirSync(join(dir, 'wal')).sort()

/** A store in a fresh directory, closed and removed when the test ends. */
const openTemp = async (t: Test): Promise<LevelStore> => (await testStore(t, 'paygate-wal-')).store as LevelStore

t.test('batches acknowledged before a SIGKILL are replayed from the log at the next open', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  const crash = crashAfterWrites(dir, 300)
  t.equal(crash.signal, 'SIGKILL')
  t.equal(crash.stdout, 'logged\n')
  t.equal(walFiles(dir).length, 1, 'the log was left behind')

  const store = await LevelStore.open(dir)
  t.teardown(() => store.close())
  t.ok(store.recovered.batches >= 300, `replayed ${store.recovered.batches} batches`)
  t.equal(store.recovered.torn, 0)
  const c = store.collection<{ i: number }>('things')
  const got = await c.getMany(Array.from({ length: 300 }, (_, i) => `k${i}`))
  t.same(
    got,
    Array.from({ length: 300 }, (_, i) => ({ i })),
  )
  t.equal(await c.get('gone'), undefined, 'a delete is replayed too')
  const listed: string[] = []
  for await (const k of c.keys()) listed.push(k)
  t.equal(listed.length, 300)
  t.same(walFiles(dir), ['000000000002.log'], 'the replayed file is removed and the next one started after it')
})

t.test('a record cut short or failing its checksum ends the replay of its file', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  crashAfterWrites(dir, 20)
  const file = join(dir, 'wal', walFiles(dir)[0]!)
  const intact = readFileSync(file)

  // a header announcing more bytes than were written: the tail of a write the process died in
  appendFileSync(file, Buffer.from([200, 0, 0, 0, 1, 2, 3, 4, 5]))
  let store = await LevelStore.open(dir)
  t.same(store.recovered, { batches: 21, torn: 1 })
  t.same(await store.collection('things').get('k19'), { i: 19 })
  await store.close()

  // the last record's payload altered: its checksum fails and it is not applied
  rmSync(join(dir, 'state'), { recursive: true, force: true })
  rmSync(join(dir, 'wal'), { recursive: true, force: true })
  crashAfterWrites(dir, 20)
  const f2 = join(dir, 'wal', walFiles(dir)[0]!)
  const bytes = readFileSync(f2)
  t.equal(bytes.length, intact.length)
  const i = bytes.lastIndexOf('!k19')
  t.ok(i > 0)
  bytes[i + 2] = '8'.charCodeAt(0) // k19 -> k89: the record still parses, only its checksum catches it
  writeFileSync(f2, bytes)
  store = await LevelStore.open(dir)
  t.teardown(() => store.close())
  t.same(store.recovered, { batches: 20, torn: 1 })
  t.equal(await store.collection('things').get('k19'), undefined, 'the altered record is not applied')
  t.same(await store.collection('things').get('k18'), { i: 18 })
})

t.test('point reads see a logged batch before LevelDB holds it; values are copies', async (t) => {
  const store = await openTemp(t)
  const c = store.collection<{ n: number }>('things')
  const value = { n: 1 }
  await store.batch([{ type: 'put', coll: c, key: 'a', value }])
  value.n = 2
  t.ok(store.logged(`!things!a`), 'still only in the log')
  t.same(await c.get('a'), { n: 1 }, 'read from the log, as it was when logged')
  t.same(await c.getMany(['missing', 'a']), [undefined, { n: 1 }])
  await store.batch([{ type: 'del', coll: c, key: 'a' }])
  t.equal(await c.get('a'), undefined, 'a logged delete hides the value')
  await store.settled()
  t.equal(store.logged(`!things!a`), undefined, 'applied to LevelDB')
  await c.put('b', { n: 3 })
  await store.settled()
  t.same(await c.get('b'), { n: 3 }, 'read from LevelDB')
})

t.test('range reads wait for LevelDB to hold every acknowledged batch', async (t) => {
  const store = await openTemp(t)
  const c = store.collection<number>('things')
  await Promise.all(Array.from({ length: 100 }, (_, i) => store.batch([{ type: 'put', coll: c, key: `k${String(i).padStart(3, '0')}`, value: i }])))
  t.ok(store.logged('!things!k099'), 'not yet in LevelDB when the range read starts')
  const seen: number[] = []
  for await (const [, v] of c.entries()) seen.push(v)
  t.same(
    seen,
    Array.from({ length: 100 }, (_, i) => i),
  )
})

t.test('full log files are removed once LevelDB holds them; close removes the rest', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  const store = await LevelStore.open(dir, { walMaxBytes: 1024 })
  const c = store.collection<string>('things')
  for (let i = 0; i < 200; i++) await c.put(`k${i}`, 'x'.repeat(100))
  await store.settled()
  const files = walFiles(dir)
  t.ok(Number(files[files.length - 1]!.slice(0, 12)) > 10, `rotated to ${files[files.length - 1]}`)
  t.ok(files.length <= 2, `only the open file (and one awaiting LevelDB) remain: ${files.join(', ')}`)
  t.equal((await c.getMany(Array.from({ length: 200 }, (_, i) => `k${i}`))).filter((v) => v === 'x'.repeat(100)).length, 200)
  await store.close()
  t.same(walFiles(dir), [])
  await t.rejects(c.put('late', 'x'), /closed/)

  const again = await LevelStore.open(dir)
  t.same(again.recovered, { batches: 0, torn: 0 })
  t.equal(await again.collection('things').get('k199'), 'x'.repeat(100))
  await again.close()
})

t.test('a log left in the JSON record format of earlier versions is replayed as well', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  mkdirSync(join(dir, 'wal'), { recursive: true })
  const record = (ops: unknown[]): Buffer => {
    const body = Buffer.from(JSON.stringify(ops), 'utf8')
    const head = Buffer.alloc(8)
    head.writeUInt32LE(body.length, 0)
    head.writeUInt32LE(crc32(body), 4)
    return Buffer.concat([head, body])
  }
  writeFileSync(
    join(dir, 'wal', '000000000001.log'),
    Buffer.concat([
      record([
        ['!things!a', '{"i":1}'],
        ['!things!b', '"ü \\" quoted"'],
      ]),
      record([['!things!a']]),
      record([['!things!c', '{"i":3}']]),
    ]),
  )
  const store = await LevelStore.open(dir)
  t.teardown(() => store.close())
  t.same(store.recovered, { batches: 3, torn: 0 })
  const c = store.collection<unknown>('things')
  t.same(await c.getMany(['a', 'b', 'c']), [undefined, 'ü " quoted', { i: 3 }])
  // and what this version logs after it replays in its own format
  await c.put('d', { s: 'ü \u{1F600} "x"' })
  t.same(await c.get('d'), { s: 'ü \u{1F600} "x"' })
})

/** Counts the store's log writes from now on; `failNext` makes the next one throw. */
function watchLog(store: LevelStore): { writes: () => number; failNext: () => void } {
  const wal = (store as unknown as { writes: { wal: { append: (...a: unknown[]) => void } } }).writes.wal
  const append = wal.append.bind(wal)
  let writes = 0
  let fail = false
  wal.append = (...a: unknown[]) => {
    writes++
    if (fail) {
      fail = false
      throw Object.assign(new Error('no space left on device'), { code: 'ENOSPC' })
    }
    append(...a)
  }
  return { writes: () => writes, failNext: () => (fail = true) }
}

t.test('batches of one turn of the event loop share one log write, and each is readable once its tick ends', async (t) => {
  const store = await openTemp(t)
  const c = store.collection<number>('things')
  const log = watchLog(store)
  const writes: Promise<void>[] = []
  const readsBetween: (number | undefined)[] = []
  for (let i = 0; i < 20; i++) {
    writes.push(store.batch([{ type: 'put', coll: c, key: `k${i}`, value: i }]))
    await Promise.resolve() // the next batch comes in a later tick of the same turn
    await Promise.resolve()
    readsBetween.push(await c.get(`k${i}`))
  }
  t.same(
    readsBetween,
    Array.from({ length: 20 }, (_, i) => i),
    'each batch is readable before the log write',
  )
  t.equal(log.writes(), 0, 'nothing written yet: the turn is not over')
  await Promise.all(writes)
  t.equal(log.writes(), 1, 'twenty batches, one log write')
  // A batch alone in its turn is written in that turn.
  await new Promise((r) => setImmediate(r))
  await store.batch([{ type: 'put', coll: c, key: 'alone', value: 1 }])
  t.equal(log.writes(), 2)
})

t.test('a log write that fails fails every batch of its turn and takes back what they staged', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  const store = await LevelStore.open(dir)
  const c = store.collection<string>('things')
  await store.batch([{ type: 'put', coll: c, key: 'kept', value: 'before' }])
  await store.batch([{ type: 'put', coll: c, key: 'applied', value: 'before' }])
  await store.settled()
  await store.batch([{ type: 'put', coll: c, key: 'flying', value: 'before' }])
  // LevelDB's next write is held open until the failing log write is over: 'flying' is in flight then.
  const db = (store as unknown as { db: { batch: (...a: unknown[]) => Promise<void> } }).db
  const dbBatch = db.batch.bind(db)
  let open!: () => void
  const held = new Promise<void>((r) => (open = r))
  db.batch = async (...a: unknown[]) => {
    db.batch = dbBatch
    await held
    return dbBatch(...a)
  }
  const flying = store.settled()
  await store.batch([{ type: 'put', coll: c, key: 'logged', value: 'before' }]) // in the log, not yet in LevelDB
  const log = watchLog(store)
  log.failNext()
  let logged = 0
  const a = store.batch([
    { type: 'put', coll: c, key: 'kept', value: 'lost' },
    { type: 'put', coll: c, key: 'fresh', value: 'lost', logged: () => logged++ },
  ])
  await Promise.resolve()
  const b = store.batch([
    { type: 'del', coll: c, key: 'applied' },
    { type: 'put', coll: c, key: 'logged', value: 'lost' },
    { type: 'put', coll: c, key: 'flying', value: 'lost' },
  ])
  await Promise.resolve()
  t.equal(await c.get('kept'), 'lost', 'staged, readable')
  // A range read that starts now waits for the staged batches, and is not left waiting when they fail.
  const range = (async () => {
    const seen: string[] = []
    for await (const [k] of c.entries()) seen.push(k)
    return seen
  })()
  const results = await Promise.allSettled([a, b])
  t.same(
    results.map((r) => (r.status === 'rejected' ? (r.reason as Error).message : 'written')),
    ['no space left on device', 'no space left on device'],
  )
  t.equal(logged, 0, 'nothing of the failed write is reported logged')
  t.same(await c.getMany(['kept', 'fresh', 'applied', 'logged', 'flying']), ['before', undefined, 'before', 'before', 'before'], 'every value as before the failed write')
  open()
  await flying
  t.same((await range).sort(), ['applied', 'flying', 'kept', 'logged'])
  await store.batch([{ type: 'put', coll: c, key: 'after', value: 'written' }])
  t.equal(log.writes(), 2, 'the failed write, then the next turn')
  await store.close()
  const again = await LevelStore.open(dir)
  t.teardown(() => again.close())
  const d = again.collection<string>('things')
  t.same(await d.getMany(['kept', 'fresh', 'applied', 'logged', 'flying', 'after']), ['before', undefined, 'before', 'before', 'before', 'written'], 'the same after a restart')
})

/** The ops of every LevelDB write from now on. */
function watchLevel(store: LevelStore): { type: string; key: string; value?: string }[][] {
  const db = (store as unknown as { db: { batch: (ops: { type: string; key: string; value?: string }[], ...rest: unknown[]) => Promise<void> } }).db
  const dbBatch = db.batch.bind(db)
  const seen: { type: string; key: string; value?: string }[][] = []
  db.batch = (ops, ...rest) => {
    seen.push(ops.map(({ type, key, value }) => ({ type, key, ...(value === undefined ? {} : { value }) })))
    return dbBatch(ops, ...rest)
  }
  return seen
}

t.test('a key written several times in one batch is logged and written once, in its last state', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  const store = await LevelStore.open(dir)
  const c = store.collection<number>('things')
  const wal = (store as unknown as { writes: { wal: { append: (batches: [string, string?][][], seq: number) => void } } }).writes.wal
  const append = wal.append.bind(wal)
  const logged: [string, string?][][] = []
  wal.append = (batches, seq) => {
    logged.push(...batches)
    append(batches, seq)
  }
  const level = watchLevel(store)
  let latestCalls = 0
  let shared = 0
  const latest = () => {
    latestCalls++
    return shared
  }
  const ops: BatchOp[] = []
  for (let i = 0; i < 4; i++) {
    shared = i
    ops.push({ type: 'put', coll: c, key: `own${i}`, value: i })
    ops.push({ type: 'put', coll: c, key: 'shared', value: -1, latest })
    ops.push({ type: 'put', coll: c, key: 'plain', value: i })
  }
  ops.push({ type: 'put', coll: c, key: 'gone', value: 7 }, { type: 'del', coll: c, key: 'gone' })
  await store.batch(ops)
  t.equal(latestCalls, 1, 'the newest state is taken once')
  t.same(
    logged.map((b) => b.map(([k, v]) => [k.replace('!things!', ''), v])),
    [
      [
        ['own0', '0'],
        ['shared', '3'],
        ['plain', '3'],
        ['own1', '1'],
        ['own2', '2'],
        ['own3', '3'],
        ['gone', undefined],
      ],
    ],
    'one record, each key once with its last value',
  )
  t.same(await c.getMany(['own2', 'shared', 'plain', 'gone']), [2, 3, 3, undefined])
  await store.settled()
  t.same(
    level.flat().filter((o) => o.key === '!things!plain'),
    [{ type: 'put', key: '!things!plain', value: '3' }],
    'LevelDB gets the last value only',
  )
  await store.close()
  const again = await LevelStore.open(dir)
  t.teardown(() => again.close())
  t.same(await again.collection<number>('things').getMany(['own0', 'own3', 'shared', 'plain', 'gone']), [0, 3, 3, 3, undefined])
})

t.test('a fresh key deleted before LevelDB is written is never written there; one deleted later is', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  const store = await LevelStore.open(dir)
  const c = store.collection<string>('things')
  const level = watchLevel(store)
  await store.batch([
    { type: 'put', coll: c, key: 'brief', value: 'x', fresh: true },
    { type: 'put', coll: c, key: 'stays', value: 'x', fresh: true },
    { type: 'put', coll: c, key: 'plain', value: 'x' },
  ])
  await store.batch([
    { type: 'del', coll: c, key: 'brief' },
    { type: 'del', coll: c, key: 'plain' },
  ])
  t.equal(await c.get('brief'), undefined)
  await store.settled()
  t.same(
    level.flat().map((o) => `${o.type} ${o.key.replace('!things!', '')}`),
    ['put stays', 'del plain'],
    'the fresh key created and deleted in one write is left out; a key not known to be new is deleted',
  )
  t.equal(store.logged('!things!brief'), undefined, 'nothing of it is left in memory either')
  t.equal(await c.get('brief'), undefined)
  // Once in LevelDB, a fresh key's later delete is written.
  await store.batch([{ type: 'del', coll: c, key: 'stays' }])
  await store.settled()
  t.same(level.at(-1), [{ type: 'del', key: '!things!stays' }])
  t.same(await c.getMany(['brief', 'stays', 'plain']), [undefined, undefined, undefined])
  await store.close()
  const again = await LevelStore.open(dir)
  t.teardown(() => again.close())
  const keys: string[] = []
  for await (const [k] of again.collection<string>('things').entries()) keys.push(k)
  t.same(keys, [], 'nothing comes back after a restart')
})

/** Keys `f000`... as puts of `value`: `n` of them fill a LevelDB write (512 distinct keys) but for what a test adds. */
const fillers = (c: BatchOp['coll'], n: number, value: string): BatchOp[] => Array.from({ length: n }, (_, i) => ({ type: 'put', coll: c, key: `f${String(i).padStart(3, '0')}`, value }))

/** Resolves once `key` (full) has left the overlay, i.e. LevelDB holds it, without waiting as a range read would. */
async function appliedKey(store: LevelStore, key: string): Promise<void> {
  for (let i = 0; i < 500 && store.logged(key); i++) await new Promise((r) => setTimeout(r, 10))
  if (store.logged(key)) throw new Error(`${key} was not written into LevelDB in 5 s`)
}

t.test('a key a newer logged batch writes again is left to that batch: LevelDB is written each key once', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  const store = await LevelStore.open(dir, { applyDelayMs: 20 })
  const c = store.collection<string>('things')
  const level = watchLevel(store)
  // The first batch fills one LevelDB write, so the second is written in the next one.
  const first = store.batch([
    ...fillers(c, 509, 'x'),
    { type: 'put', coll: c, key: 'rec', value: 'pending', fresh: true },
    { type: 'put', coll: c, key: 'out', value: 'queued', fresh: true },
    { type: 'put', coll: c, key: 'old', value: 'kept' },
  ])
  const second = store.batch([
    { type: 'put', coll: c, key: 'rec', value: 'paid' },
    { type: 'del', coll: c, key: 'out' },
    { type: 'del', coll: c, key: 'old' },
  ])
  await Promise.all([first, second])
  await appliedKey(store, '!things!rec')
  t.same(
    level.map((ops) => ops.filter((o) => !o.key.startsWith('!things!f')).map((o) => `${o.type} ${o.key.replace('!things!', '')} ${o.value ?? ''}`.trim())),
    [[], ['put rec "paid"', 'del old']],
    'two writes: the fillers, then the record in its last state; the fresh key deleted later is never written, a key LevelDB may have is deleted',
  )
  t.equal(level[0]!.length, 509)
  t.same(await c.getMany(['rec', 'out', 'old', 'f000']), ['paid', undefined, undefined, 'x'])
  await store.close()
  const again = await LevelStore.open(dir)
  t.teardown(() => again.close())
  t.same(await again.collection<string>('things').getMany(['rec', 'out', 'old', 'f508']), ['paid', undefined, undefined, 'x'], 'the same after a restart')
})

t.test('a range read waiting for a batch finds each key as of that batch, though a newer logged batch writes it again', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  const store = await LevelStore.open(dir, { applyDelayMs: 600_000 })
  const c = store.collection<string>('things')
  await store.batch([{ type: 'put', coll: c, key: 'z', value: 'first' }])
  // LevelDB's first write is held until both batches below are logged; the third (the newer batch's) until the range read is done.
  const db = (store as unknown as { db: { batch: (...a: unknown[]) => Promise<void> } }).db
  const dbBatch = db.batch.bind(db)
  const gate = () => {
    let resolve!: () => void
    const promise = new Promise<void>((r) => (resolve = r))
    return { promise, resolve }
  }
  const gates = [gate(), gate()]
  let calls = 0
  db.batch = async (...a: unknown[]) => {
    const n = calls++
    if (n === 0) await gates[0]!.promise
    if (n === 2) await gates[1]!.promise
    return dbBatch(...a)
  }
  const flying = store.settled()
  // A batch that fills one LevelDB write: the newer one below is left to the next.
  await store.batch([...fillers(c, 511, 'x'), { type: 'put', coll: c, key: 'rec', value: 'pending', fresh: true }])
  const it = c.entries()[Symbol.asyncIterator]()
  const firstEntry = it.next() // begins the range read: it waits for the batch above
  await store.batch([{ type: 'put', coll: c, key: 'rec', value: 'paid' }])
  gates[0]!.resolve()
  await flying
  const seen = new Map<string, string>()
  for (let r = await firstEntry; !r.done; r = await it.next()) seen.set(r.value[0], r.value[1])
  gates[1]!.resolve()
  t.equal(seen.size, 513, 'every key of the batches it waited for')
  t.equal(seen.get('rec'), 'pending', 'the record as of the batch it waited for; the newer state is not yet in LevelDB')
  await store.settled()
  t.equal(await c.get('rec'), 'paid')
  await store.close()
})

t.test('a key left to a newer batch is not lost when the process dies after the older batch reached LevelDB', async (t) => {
  const dir = testDir(t, 'paygate-wal-')
  // The first batch fills a log file and a LevelDB write; its record is left to the second,
  // logged in the next file. The process dies as LevelDB is given the second.
  const script = `
    import { readdirSync } from 'node:fs'
    import { LevelStore } from './src/store/index.ts'
    const store = await LevelStore.open(process.argv[1], { applyDelayMs: 20, walMaxBytes: 1024 })
    const db = store.db
    const dbBatch = db.batch.bind(db)
    let calls = 0
    const say = (o) => process.stdout.write(JSON.stringify(o) + '\\n')
    db.batch = (...a) => {
      if (++calls === 1) say({ first: a[0].length, rec: a[0].some((o) => o.key.endsWith('!rec')) })
      else {
        say({ logs: readdirSync(process.argv[1] + '/wal').length })
        process.kill(process.pid, 'SIGKILL')
      }
      return dbBatch(...a)
    }
    const c = store.collection('things')
    const fill = Array.from({ length: 511 }, (_, i) => ({ type: 'put', coll: c, key: 'f' + i, value: 'x' }))
    await store.batch([...fill, { type: 'put', coll: c, key: 'rec', value: 'pending', fresh: true }])
    await store.batch([{ type: 'put', coll: c, key: 'rec', value: 'paid' }])
    await new Promise((r) => setTimeout(r, 5000))`
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script, dir], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 })
  t.equal(r.signal, 'SIGKILL', r.stderr)
  t.same(
    r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l)),
    [{ first: 511, rec: false }, { logs: 1 }],
    'LevelDB got the fillers without the record, and the first log file was removed then',
  )
  const again = await LevelStore.open(dir)
  t.teardown(() => again.close())
  const c = again.collection<string>('things')
  t.same(await c.getMany(['rec', 'f0', 'f510']), ['paid', 'x', 'x'], 'the record in its last state, from the log')
})
