import t, { type Test } from 'tap'
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { killStaleAnvil } from '../../src/chain/devnet/anvil.js'
import { testDir } from '../helpers/gateway.js'

/**
 * A start kills the anvil its data dir's pid file names, left by a crashed run, but only when
 * that process serves this data dir: a copy of a live data dir names the original's anvil,
 * which another Paygate is using.
 */

/** A live process whose command line looks like an anvil's serving `ipc`. */
async function fakeAnvil(t: Test, ipc: string): Promise<ChildProcess> {
  const p = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)', '/opt/foundry/bin/anvil', '--no-mining', '--ipc', ipc], { stdio: 'ignore' })
  await once(p, 'spawn')
  t.teardown(() => {
    if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL')
  })
  return p
}
const alive = (p: ChildProcess): boolean => p.exitCode === null && p.signalCode === null
const settle = () => new Promise((r) => setTimeout(r, 100))
const logs: string[] = []
const log = (msg: string) => void logs.push(msg)

t.test("this dir's stale anvil is killed", async (t) => {
  const dir = testDir(t)
  const ipc = join(dir, 'anvil.ipc')
  const p = await fakeAnvil(t, ipc)
  writeFileSync(join(dir, 'anvil.pid'), `${p.pid}\n${dir}\n${ipc}\n`)
  const exited = once(p, 'exit')
  killStaleAnvil(join(dir, 'anvil.pid'), dir, log)
  await exited
  t.equal(p.signalCode, 'SIGKILL')
})

t.test("a copy of a live data dir leaves the original's anvil running", async (t) => {
  const original = testDir(t)
  const copy = testDir(t)
  const ipc = join(original, 'anvil.ipc')
  const p = await fakeAnvil(t, ipc)
  writeFileSync(join(copy, 'anvil.pid'), `${p.pid}\n${original}\n${ipc}\n`)
  killStaleAnvil(join(copy, 'anvil.pid'), copy, log)
  await settle()
  t.ok(alive(p), 'still running')
  t.match(logs.at(-1), /not this data dir's anvil; left alone/)
})

t.test("a pid file of one line (written before the dir was recorded): only an anvil on this dir's socket is killed", async (t) => {
  const original = testDir(t)
  const copy = testDir(t)
  const p = await fakeAnvil(t, join(original, 'anvil.ipc'))
  writeFileSync(join(copy, 'anvil.pid'), String(p.pid))
  killStaleAnvil(join(copy, 'anvil.pid'), copy, log)
  await settle()
  t.ok(alive(p), "another dir's anvil is left alone")
  writeFileSync(join(original, 'anvil.pid'), String(p.pid))
  const exited = once(p, 'exit')
  killStaleAnvil(join(original, 'anvil.pid'), original, log)
  await exited
  t.equal(p.signalCode, 'SIGKILL', "its own dir's is killed")
})

t.test('a pid now used by a process that is not an anvil is left alone', async (t) => {
  const dir = testDir(t)
  const p = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' })
  await once(p, 'spawn')
  t.teardown(() => void p.kill('SIGKILL'))
  writeFileSync(join(dir, 'anvil.pid'), `${p.pid}\n${dir}\n${join(dir, 'anvil.ipc')}\n`)
  killStaleAnvil(join(dir, 'anvil.pid'), dir, log)
  await settle()
  t.ok(alive(p))
})
