/**
 * The embedded chain when anvil stops answering: a call anvil leaves unanswered fails after the
 * IPC timeout, and an anvil that dies is logged and fails every call, waiting or new, at once.
 * Each case runs twice: in process (startDevnet) and on the chain's own thread, as the gateway
 * runs it (startDevnetThread: the same errors, by class and message, and the same log lines).
 */
import t, { type Test } from 'tap'
import { rmSync } from 'node:fs'
import { DevnetUnavailableError, startDevnet, type Devnet, type DevnetOptions } from '../../src/chain/devnet/index.js'
import { startDevnetThread } from '../../src/chain/devnet/thread.js'
import { alive, freeze } from '../helpers/freeze.js'
import { tempDir } from '../helpers/gateway.js'

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

type Start = (opts: DevnetOptions) => Promise<Devnet>

async function open(t: Test, start: Start, opts: Partial<DevnetOptions> = {}): Promise<{ chain: Devnet; logs: { msg: string; fields?: any }[] }> {
  const dir = tempDir('paygate-devnet-down-')
  const logs: { msg: string; fields?: any }[] = []
  const chain = await start({ dataDir: dir, chainId: 31337, host: '127.0.0.1', port: 0, idleSnapshotMs: 600_000, log: (msg, fields) => logs.push({ msg, fields }), ...opts })
  t.teardown(async () => {
    if (alive(chain.childPid)) process.kill(chain.childPid, 'SIGCONT')
    await chain.close()
    rmSync(dir, { recursive: true, force: true })
  })
  return { chain, logs }
}

/** How a promise settles, and after how long. */
async function settle(p: Promise<unknown>): Promise<{ ms: number; error: unknown }> {
  const t0 = Date.now()
  const error = await p.then(
    () => null,
    (e: unknown) => e,
  )
  return { ms: Date.now() - t0, error }
}

for (const [where, start] of [
  ['in process', startDevnet],
  ['on its thread', startDevnetThread],
] as [string, Start][]) {
  t.test(`${where}: a call a frozen anvil leaves unanswered fails after the IPC timeout; the chain answers again once anvil does`, async (t) => {
    const { chain } = await open(t, start, { ipcTimeoutMs: 1000 })
    await freeze(chain.childPid)
    const r = await settle(chain.request({ method: 'eth_blockNumber' }))
    t.type(r.error, DevnetUnavailableError)
    t.match((r.error as Error).message, /anvil did not answer eth_blockNumber within 1 s/)
    t.ok(r.ms >= 900 && r.ms < 3000, `failed after ${r.ms} ms`)
    process.kill(chain.childPid, 'SIGCONT')
    t.ok(Number(await chain.request({ method: 'eth_blockNumber' })) >= 0, 'answers again')
  })

  t.test(`${where}: an anvil killed under Paygate is logged, and waiting and new calls fail at once`, async (t) => {
    const { chain, logs } = await open(t, start)
    // a call waiting on anvil when it dies (frozen first, so the call is surely waiting)
    await freeze(chain.childPid)
    const waiting = settle(chain.request({ method: 'eth_chainId' }))
    await sleep(200)
    process.kill(chain.childPid, 'SIGKILL')
    const w = await waiting
    t.type(w.error, DevnetUnavailableError, 'the waiting call fails')
    t.ok(w.ms < 2000, `the waiting call failed after ${w.ms} ms (the IPC timeout is 30 s)`)

    const end = Date.now() + 3000
    while (Date.now() < end && !logs.some((l) => l.msg === 'anvil exited unexpectedly')) await sleep(20)
    const line = logs.find((l) => l.msg === 'anvil exited unexpectedly')
    t.ok(line, 'logged')
    t.equal(line?.fields?.signal, 'SIGKILL')

    for (const method of ['eth_blockNumber', 'eth_call', 'evm_mine']) {
      const r = await settle(chain.request({ method, params: method === 'eth_call' ? [{ data: '0x00' }, 'latest'] : [] }))
      t.type(r.error, DevnetUnavailableError, `${method} fails`)
      t.match((r.error as Error).message, /anvil exited unexpectedly \(SIGKILL\)/)
      // At once: well inside the 30 s IPC timeout a call to a live but silent anvil would wait.
      t.ok(r.ms < 5000, `${method} failed after ${r.ms} ms`)
    }
    const sent = await settle(chain.sendRawTransactions(['0x00']))
    t.type(sent.error, DevnetUnavailableError, 'a batched send fails')
    // over HTTP: a JSON-RPC error, at once
    const t0 = Date.now()
    const res = await fetch(chain.rpcUrl, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'eth_blockNumber', params: [] }) })
    const body = (await res.json()) as { id: number; error?: { message: string } }
    t.match(body, { id: 7, error: { message: /anvil exited unexpectedly/ } })
    t.ok(Date.now() - t0 < 5000, 'at once, well inside the IPC timeout')
  })

  t.test(`${where}: a state change a frozen anvil leaves unanswered stops the chain: the journal could no longer match it`, async (t) => {
    const { chain, logs } = await open(t, start, { ipcTimeoutMs: 1000 })
    await freeze(chain.childPid)
    const r = await settle(chain.request({ method: 'evm_mine' }))
    t.type(r.error, DevnetUnavailableError)
    process.kill(chain.childPid, 'SIGCONT')
    // anvil may now run the unjournalled mine; nothing more is sent to it.
    const after = await settle(chain.request({ method: 'eth_blockNumber' }))
    // Refused by the stopped chain, not timed out (that would say anvil did not answer).
    t.match((after.error as Error)?.message, /anvil stalled on a state change .*restart Paygate/, 'every later call is refused')
    t.ok(after.ms < 1000, `at once (${after.ms} ms), inside the 1 s IPC timeout`)
    t.ok(
      logs.some((l) => l.msg.startsWith('anvil stalled on a state change')),
      'logged',
    )
  })
}
