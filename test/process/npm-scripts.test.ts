import t, { type Test } from 'tap'
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { connect } from 'node:net'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { testDir } from '../helpers/gateway.js'
import { call, spawnGateway } from '../helpers/process.js'
import { START_NODE_ARGS } from '../../bench/lib.js'

/**
 * The package scripts as a user runs them: `npm start` (the compiled gateway, built
 * incrementally) stops cleanly on SIGTERM to npm and on Ctrl-C; `npm run demo` pays and
 * prints commands that work as written. One file, run in order: each script builds dist/.
 * Only this test's own processes are signalled, by pid or by the process group it created.
 */
t.setTimeout(600_000)
const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const sh = promisify(execFile)

interface NpmRun {
  proc: ChildProcess
  out: string[]
  err: string[]
  exited: Promise<number | string>
  /** Resolves with the first output line matching `re`. */
  line(re: RegExp, ms?: number): Promise<string>
}

/** `npm <args>` in its own process group, with only PATH, HOME and the given variables. */
function npm(t: Test, args: string[], env: Record<string, string>): NpmRun {
  const proc = spawn('npm', args, { cwd: ROOT, detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env } })
  const out: string[] = []
  const err: string[] = []
  const waiting: { re: RegExp; resolve: (l: string) => void }[] = []
  const take = (into: string[]) => (d: Buffer) => {
    for (const l of d.toString().split('\n').filter(Boolean)) {
      into.push(l)
      for (const w of waiting.filter((w) => w.re.test(l))) {
        waiting.splice(waiting.indexOf(w), 1)
        w.resolve(l)
      }
    }
  }
  proc.stdout!.on('data', take(out))
  proc.stderr!.on('data', take(err))
  const exited = new Promise<number | string>((r) => proc.on('exit', (c, s) => r(c ?? s ?? -1)))
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) process.kill(-proc.pid!, 'SIGKILL')
  })
  return {
    proc,
    out,
    err,
    exited,
    line(re, ms = 240_000) {
      const seen = [...out, ...err].find((l) => re.test(l))
      if (seen) return Promise.resolve(seen)
      return new Promise((resolve, reject) => {
        waiting.push({ re, resolve })
        const timer = setTimeout(() => reject(new Error(`no line ${re} within ${ms} ms:\n${out.join('\n')}\n${err.join('\n')}`)), ms)
        timer.unref()
        exited.then((c) => reject(new Error(`npm ${args.join(' ')} exited (${c}) before ${re}:\n${out.join('\n')}\n${err.join('\n')}`)))
      })
    },
  }
}

/** The pids of `pid`'s children (Linux). */
const childrenOf = (pid: number): number[] => readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(' ').filter(Boolean).map(Number)
const alive = (pid: number): boolean => existsSync(`/proc/${pid}`) && !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z ')
const refused = (port: number): Promise<boolean> =>
  new Promise((resolve) => {
    const s = connect(port, '127.0.0.1')
    s.once('connect', () => {
      s.destroy()
      resolve(false)
    })
    s.once('error', () => resolve(true))
  })
/** Processes whose command line names `dir` (the gateway's anvil): none may outlive a stop. */
const namingDir = (dir: string): string[] =>
  readdirSync('/proc').filter((p) => {
    try {
      return /^\d+$/.test(p) && readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(dir)
    } catch {
      return false
    }
  })
const ports = { PAYGATE_API_PORT: '0', PAYGATE_PROXY_PORT: '0', PAYGATE_CHAIN_RPC_PORT: '0' }

async function startNpm(t: Test, dataDir: string): Promise<{ run: NpmRun; gateway: number; api: number }> {
  const run = npm(t, ['start'], { ...ports, PAYGATE_DATA_DIR: dataDir, PAYGATE_CERTS_DIR: join(dataDir, 'certs') })
  const started = JSON.parse(await run.line(/"msg":"paygate started"/))
  const [gateway] = childrenOf(run.proc.pid!)
  t.ok(gateway, 'the gateway is npm’s own child (exec: no shell in between)')
  t.equal(
    readFileSync(`/proc/${gateway}/cmdline`, 'utf8'),
    `${['node', ...START_NODE_ARGS, 'dist/paygate.js'].join('\0')}\0`,
    'it runs the compiled program (bundled), with the Node flags the benchmarks measure',
  )
  return { run, gateway: gateway!, api: Number(new URL(started.api).port) }
}

/**
 * What the bundle's modules find beside their own files in dist/ (scripts/bundle.mjs rewrites
 * their import.meta.url): the OpenAPI document, the dashboard, the default config (its chain
 * settings), the embedded chain's worker thread and the native addons.
 */
async function bundleFindsItsFiles(t: Test, api: number, dataDir: string): Promise<void> {
  const base = `http://127.0.0.1:${api}`
  const openapi = await fetch(`${base}/v1/openapi.json`)
  t.equal(openapi.status, 200, 'the OpenAPI document is served')
  t.match(((await openapi.json()) as { openapi: string }).openapi, /^3\./)
  const ui = await fetch(`${base}/ui/`)
  t.equal(ui.status, 200, 'the dashboard is served')
  t.match(await ui.text(), /<html/i)
  const key = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const chain = (await call(base, 'GET', '/v1/chain', key)).body as { chainId: number; embedded?: boolean; ledger: string }
  t.equal(chain.chainId, 31337, 'the chain of the default config (config/default.json)')
  t.equal(chain.embedded, true, 'the embedded chain runs (its worker thread)')
  t.match(chain.ledger, /^0x[0-9a-fA-F]{40}$/)
  const agent = await call(base, 'POST', '/v1/agents', key, { agentId: 'bundle-check' })
  t.equal(agent.status, 201, 'an agent is created (LevelDB, a native addon)')
  const wallet = await call(base, 'POST', '/v1/wallets', key, { agentId: 'bundle-check' })
  t.equal(wallet.status, 201, 'a wallet is created and funded on the embedded chain')
}

t.test('npm start: SIGTERM to npm stops the gateway cleanly; Ctrl-C too; a start after no change rebuilds nothing', async (t) => {
  const dataDir = testDir(t)
  const first = await startNpm(t, dataDir)
  await bundleFindsItsFiles(t, first.api, dataDir)
  // A second start on the same data directory, while the first runs: it names the holder.
  const second = spawn(process.execPath, ['dist/paygate.js'], { cwd: ROOT, env: { PATH: process.env.PATH ?? '', ...ports, PAYGATE_DATA_DIR: dataDir, PAYGATE_CERTS_DIR: join(dataDir, 'certs') } })
  let secondErr = ''
  second.stderr!.on('data', (d) => (secondErr += d))
  t.equal(await new Promise((r) => second.on('exit', r)), 1)
  t.match(secondErr, `held by pid ${first.gateway}`)

  const built = [statSync(join(ROOT, 'dist/main.js')).mtimeMs, statSync(join(ROOT, 'dist/paygate.js')).mtimeMs]
  process.kill(first.run.proc.pid!, 'SIGTERM')
  t.equal(await first.run.exited, 0, 'npm exits 0')
  t.ok(
    first.run.out.some((l) => l.includes('"msg":"stopped"')),
    'the gateway ran its shutdown to the end',
  )
  t.notOk(alive(first.gateway), 'the gateway process is gone')
  t.ok(await refused(first.api), 'its API port is free')
  t.same(namingDir(dataDir), [], 'no anvil left behind')

  const again = await startNpm(t, dataDir)
  t.same([statSync(join(ROOT, 'dist/main.js')).mtimeMs, statSync(join(ROOT, 'dist/paygate.js')).mtimeMs], built, 'nothing changed: nothing rebuilt, nor bundled again')
  // Ctrl-C: the terminal signals the whole foreground group (npm and the gateway).
  process.kill(-again.run.proc.pid!, 'SIGINT')
  await again.run.exited
  t.equal(again.run.out.filter((l) => l.includes('"msg":"shutting down"')).length, 1, 'one shutdown')
  t.ok(again.run.out.some((l) => l.includes('"msg":"stopped"')))
  t.notOk(alive(again.gateway))
  t.ok(await refused(again.api))
})

/** Run each `curl` command the demo printed, as written, in sh. */
async function printedCommands(t: Test, out: string[]): Promise<string[]> {
  const cmds = out.filter((l) => l.startsWith('  curl '))
  t.equal(cmds.length, 4, 'four commands printed')
  const answers: string[] = []
  for (const c of cmds) answers.push((await sh('sh', ['-c', c], { env: { PATH: process.env.PATH ?? '' }, timeout: 60_000 })).stdout)
  return answers
}

function checkPaid(t: Test, out: string[]): void {
  const text = out.join('\n')
  t.match(text, /Paid through POST \/v1\/pay: GET http:\/\/127\.0\.0\.1:\d+\/paid\n {2}price 0\.01 USDC, protocol x402 \(stablecoin\), network paygate-devnet, status paid/)
  t.match(text, /Paid through the proxy \((curl|node)\): GET http:\/\/127\.0\.0\.1:\d+\/mpp\n {2}price 0\.01 USDC, protocol mpp \(stablecoin\), network paygate-devnet, status paid/)
  t.match(text, /merchant's settlement 0x[0-9a-f]{64}/)
  t.equal(text.match(/on-chain ledger record 0x[0-9a-f]{64}: confirmed in block \d+/g)?.length, 2, 'both ledger records confirmed on chain')
  const [, before, after] = /Balance: ([\d.]+) USDC before, ([\d.]+) USDC after/.exec(text) ?? []
  t.equal(Math.round((Number(before) - Number(after)) * 100), 2, 'the wallet paid 0.02 USDC')
}

t.test('npm run demo in a temp dir: pays twice, the printed commands work as written, Ctrl-C stops and cleans up', async (t) => {
  const demo = npm(t, ['run', 'demo'], ports)
  await demo.line(/Press Ctrl-C to stop/)
  checkPaid(t, demo.out)
  const dir = /Started a gateway in (\S+) /.exec(demo.out.join('\n'))?.[1]
  t.ok(dir && existsSync(dir), 'its temp dir')
  const [proxied, paid, txs, wallet] = await printedCommands(t, demo.out)
  t.match(JSON.parse(proxied!), { ok: true, paidWith: 'x402' })
  t.match(JSON.parse(paid!), { protocol: 'mpp', amountPaid: { usdc: 0.01 }, status: 200 })
  t.equal(JSON.parse(txs!).transactions.length, 4, 'the demo’s two payments and the two commands’')
  t.type(JSON.parse(wallet!).balance.usdc, 'number')
  const dashboard = demo.out.find((l) => l.includes('Dashboard: '))
  t.match(dashboard, /Dashboard: http:\/\/127\.0\.0\.1:\d+\/$/, 'the dashboard link')
  process.kill(-demo.proc.pid!, 'SIGINT')
  t.equal(await demo.exited, 0)
  t.notOk(existsSync(dir!), 'the temp dir is removed')
  t.same(namingDir(dir!), [], 'no anvil left behind')
})

t.test('npm run demo against a running gateway uses it (its account key file) and leaves it running', async (t) => {
  const dataDir = testDir(t)
  // Without its dashboard: the demo must not print a link that answers 404.
  const gw = await spawnGateway({ PAYGATE_DATA_DIR: dataDir, PAYGATE_API_DASHBOARD: 'false' })
  t.teardown(() => gw.stop('SIGKILL'))
  const started = gw.stdout.map((l) => JSON.parse(l)).find((j) => j.msg === 'paygate started')
  const env = { PAYGATE_DATA_DIR: dataDir, PAYGATE_API_PORT: new URL(started.api).port, PAYGATE_PROXY_PORT: new URL(started.proxy).port }
  const demo = npm(t, ['run', 'demo'], env)
  await demo.line(/Press Ctrl-C to stop/)
  t.ok(demo.out.some((l) => l === `Using the gateway at ${started.api} (proxy ${started.proxy})`))
  checkPaid(t, demo.out)
  const [proxied] = await printedCommands(t, demo.out)
  t.match(JSON.parse(proxied!), { ok: true, paidWith: 'x402' })
  t.match(demo.out.join('\n'), `$(cat ${join(dataDir, 'account-key')})`, 'commands read the key file, the key is not printed')
  t.ok(
    demo.out.some((l) => l.includes('Dashboard: not served by this gateway (api.dashboard is false)')),
    'no link to a dashboard that is not served',
  )
  process.kill(-demo.proc.pid!, 'SIGINT')
  t.equal(await demo.exited, 0)
  t.equal((await fetch(`${started.api}/healthz`)).status, 200, 'the gateway still runs')
  t.equal(await gw.stop('SIGTERM'), 0)
})
