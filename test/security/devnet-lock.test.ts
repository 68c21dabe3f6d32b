import t, { type Test } from 'tap'
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { lockFile } from '../../src/util/file-lock.js'
import { startDevnet } from '../../src/chain/devnet/index.js'
import { testDir } from '../helpers/gateway.js'
import { spawnGateway } from '../helpers/process.js'

const LOCK_MODULE = fileURLToPath(new URL('../../src/util/file-lock.ts', import.meta.url))

/** A separate process that takes the lock on `file` and holds it until killed. */
async function holder(t: Test, file: string): Promise<ChildProcess> {
  const code = `import(${JSON.stringify(LOCK_MODULE)}).then((m) => { m.lockFile(${JSON.stringify(file)}, 'test'); console.log('locked'); setInterval(() => {}, 1000) })`
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], { stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  })
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (d: Buffer) => d.toString().includes('locked') && resolve())
    child.once('exit', (c) => reject(new Error(`the lock holder exited (${c})`)))
  })
  return child
}

const exited = (c: ChildProcess): Promise<void> => new Promise((r) => (c.exitCode !== null || c.signalCode !== null ? r() : c.once('exit', () => r())))

t.test('a live holder blocks with a clear message; once SIGKILLed, its lock is free', async (t) => {
  const file = join(testDir(t), 'devnet.lock')
  const child = await holder(t, file)
  t.throws(() => lockFile(file, 'embedded chain: /x'), { message: `embedded chain: /x is in use by another process (held by pid ${child.pid})` })
  child.kill('SIGKILL')
  await exited(child)
  const lock = lockFile(file, 'embedded chain: /x')
  t.ok(lock.kernel, 'an OS lock (flock)')
  t.equal(readFileSync(file, 'utf8'), String(process.pid), 'the file names the new holder')
  lock.release()
  lockFile(file, 'again').release()
})

t.test('a lock file naming an unrelated live process does not block the embedded chain', async (t) => {
  const dir = testDir(t)
  // The test runner that started this test: alive, and not holding any lock (a reused pid).
  writeFileSync(join(dir, 'devnet.lock'), String(process.ppid))
  const chain = await startDevnet({ dataDir: dir, chainId: 31337, host: '127.0.0.1', port: 0 })
  t.teardown(() => chain.close())
  t.match(await chain.request({ method: 'eth_chainId' }), /^0x/)
  t.equal(readFileSync(join(dir, 'devnet.lock'), 'utf8'), String(process.pid))
})

t.test('a gateway SIGKILLed holding the lock does not block the next start on its data dir', async (t) => {
  const dataDir = testDir(t)
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.equal(readFileSync(join(dataDir, 'chain', 'devnet.lock'), 'utf8'), String(first.proc.pid))
  t.equal(await first.stop('SIGKILL'), 'SIGKILL')
  const second = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => second.stop())
  t.equal(readFileSync(join(dataDir, 'chain', 'devnet.lock'), 'utf8'), String(second.proc.pid))
  t.equal(await second.stop('SIGTERM'), 0)
})
