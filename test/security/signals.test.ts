import t, { type Test } from 'tap'
import { connect } from 'node:net'
import { testDir } from '../helpers/gateway.js'
import { spawnGateway, type GatewayProcess } from '../helpers/process.js'

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))
const messages = (lines: string[]): string[] =>
  lines.flatMap((l) => {
    try {
      return [String(JSON.parse(l).msg)]
    } catch {
      return []
    }
  })

/** A request still arriving on the API port: a graceful shutdown waits for it up to its grace period. */
async function pendingRequest(t: Test, g: GatewayProcess): Promise<void> {
  const { hostname, port } = new URL(g.url)
  const socket = connect(Number(port), hostname)
  t.teardown(() => socket.destroy())
  socket.on('error', () => {})
  await new Promise((r) => socket.once('connect', r))
  socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n')
  await sleep(100)
}

t.test('two SIGINTs 33 ms apart (Ctrl-C to the process group under npm start): one graceful shutdown, exit 0', async (t) => {
  const g = await spawnGateway({ PAYGATE_DATA_DIR: testDir(t), PAYGATE_SHUTDOWN_GRACE_MS: '1500' })
  t.teardown(() => g.stop('SIGKILL'))
  // Without a request in flight the whole shutdown can take less than 33 ms.
  await pendingRequest(t, g)
  g.proc.kill('SIGINT')
  await sleep(33)
  g.proc.kill('SIGINT')
  t.equal(await g.exited, 0)
  const msgs = messages(g.stdout)
  t.equal(msgs.filter((m) => m === 'shutting down').length, 1)
  t.ok(msgs.includes('stopped'), 'the shutdown ran to its end')
  t.notOk(msgs.includes('second signal: exiting now'))
})

t.test('a second signal well after the first still forces the exit', async (t) => {
  const g = await spawnGateway({ PAYGATE_DATA_DIR: testDir(t), PAYGATE_SHUTDOWN_GRACE_MS: '20000' })
  t.teardown(() => g.stop('SIGKILL'))
  await pendingRequest(t, g)
  g.proc.kill('SIGTERM')
  await sleep(1500)
  t.equal(g.proc.exitCode, null, 'still shutting down gracefully')
  g.proc.kill('SIGTERM')
  t.equal(await g.exited, 1)
  t.ok(messages(g.stdout).includes('second signal: exiting now'))
})
