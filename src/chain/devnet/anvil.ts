import { type ChildProcess, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import * as fs from 'node:fs'
import { createRequire } from 'node:module'
import * as os from 'node:os'
import * as path from 'node:path'
import { IpcClient } from './ipc.js'
import type { DevnetLog } from './types.js'

/** A running anvil under its watchdog shell, and the IPC connection to it. */
export interface Child {
  proc: ChildProcess
  anvilPid: number
  ipc: IpcClient
  ipcPath: string
  stderrTail: () => string
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

function kill(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal)
  } catch {}
}

export function anvilBinary(explicit?: string): string {
  if (explicit) return explicit
  const arch = process.arch === 'x64' ? 'amd64' : process.arch
  const pkg = `@foundry-rs/anvil-${process.platform}-${arch}`
  const require = createRequire(import.meta.url)
  let dir: string
  try {
    dir = path.dirname(require.resolve(`${pkg}/package.json`))
  } catch {
    throw new Error(`embedded chain: npm package ${pkg} is not installed (set chain.anvilPath, PAYGATE_CHAIN_ANVIL_PATH, or configure chain.rpcUrl)`)
  }
  const bin = path.join(dir, 'bin', process.platform === 'win32' ? 'anvil.exe' : 'anvil')
  try {
    fs.accessSync(bin, fs.constants.X_OK)
  } catch {
    fs.chmodSync(bin, 0o755)
  }
  return bin
}

/**
 * The TCP ports process `pid` listens on (Linux /proc). anvil serves HTTP JSON-RPC on a port of
 * its own choosing beside the IPC socket Paygate uses (no flag turns it off): that port, with its
 * dev methods, must be refused to agents like the chain's own (gateway.ts protects both).
 */
export function listeningPorts(pid: number): number[] {
  const inodes = new Set<string>()
  try {
    for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkOrEmpty(`/proc/${pid}/fd/${fd}`))
      if (m) inodes.add(m[1]!)
    }
  } catch {
    return []
  }
  const ports = new Set<number>()
  for (const table of ['tcp', 'tcp6']) {
    let text: string
    try {
      text = fs.readFileSync(`/proc/${pid}/net/${table}`, 'utf8')
    } catch {
      continue
    }
    // sl local_address rem_address st ... inode: st 0A is LISTEN; the port is local_address's hex after ':'.
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/)
      if (f[3] === '0A' && f[9] !== undefined && inodes.has(f[9])) ports.add(Number.parseInt(f[1]!.split(':')[1]!, 16))
    }
  }
  return [...ports]
}

function readlinkOrEmpty(p: string): string {
  try {
    return fs.readlinkSync(p)
  } catch {
    return ''
  }
}

/** anvil's command line: it never mines by itself (the miner does), and starts from `loadState` if given. */
// --transaction-block-keeper: anvil forgets the txs and receipts of older blocks (the receipt
// archive keeps them), so its memory, state dumps and restarts stay the same size as history grows.
export function anvilArgs(chainId: number, genesisTime: number, hardfork: string, loadState: string | undefined, keepBlocks: number): string[] {
  const args = ['--silent', '--host', '127.0.0.1', '--port', '0', '--no-mining', '--order', 'fifo', '--chain-id', String(chainId)]
  args.push('--timestamp', String(genesisTime), '--hardfork', hardfork, '--gas-limit', '100000000', '--prune-history', '32', '--transaction-block-keeper', String(keepBlocks))
  if (loadState) args.push('--load-state', loadState)
  return args
}

/**
 * A stale anvil from a crashed run (its watchdog should have killed it), if it is this data dir's:
 * its `--ipc` is the path the pid file recorded for this dir (or, in a pid file of one line, the
 * dir's own socket). A copy of a live data dir names the original's anvil, still serving
 * another Paygate, and a pid may have been reused: neither is killed.
 */
export function killStaleAnvil(pidFile: string, dir: string, log: DevnetLog): void {
  try {
    const [pidLine = '', ownerDir, recordedIpc] = fs.readFileSync(pidFile, 'utf8').split('\n')
    const old = Number(pidLine)
    if (!(old > 0) || !pidAlive(old)) return
    const ipc = ownerDir === undefined || ownerDir === '' ? path.join(dir, 'anvil.ipc') : ownerDir === dir ? recordedIpc : undefined
    const args = fs.readFileSync(`/proc/${old}/cmdline`, 'utf8').split('\0')
    const at = args.indexOf('--ipc')
    if (!ipc || at < 0 || args[at + 1] !== ipc || !args.some((a) => a.includes('anvil'))) {
      log("the anvil pid file names a live process that is not this data dir's anvil; left alone", { pid: old })
      return
    }
    log('killing stale anvil', { pid: old }, 'warn')
    process.kill(old, 'SIGKILL')
  } catch {}
}

// The shell keeps our pipe on fd 3; a subshell reading it kills anvil on EOF (we closed it,
// exited or were SIGKILLed). The shell itself waits for anvil and exits with its status, so
// an anvil that dies is seen here as the watchdog's exit (128+n: killed by signal n).
const WATCHDOG = 'exec 3<&0; "$0" "$@" </dev/null & p=$!; echo "pid $p"; (read -r _ <&3; kill $p 2>/dev/null) & r=$!; wait $p; s=$?; kill $r 2>/dev/null; exit $s'

export async function spawnAnvil(bin: string, args: string[], dir: string, pidFile: string, ipcTimeoutMs: number, log: DevnetLog): Promise<Child> {
  // in the data dir (a socket left by a killed anvil is replaced next time), unless the path is
  // too long for a unix socket
  let ipcPath = path.join(dir, 'anvil.ipc')
  if (Buffer.byteLength(ipcPath) > 100) ipcPath = path.join(os.tmpdir(), `paygate-anvil-${process.pid}-${randomBytes(4).toString('hex')}.ipc`)
  fs.rmSync(ipcPath, { force: true })
  // Own process group: a terminal's Ctrl-C (or `timeout`) signals Paygate, which snapshots and
  // then stops anvil itself, instead of killing anvil first.
  const proc = spawn('/bin/sh', ['-c', WATCHDOG, bin, ...args, '--ipc', ipcPath], { stdio: ['pipe', 'pipe', 'pipe'], detached: true })
  proc.stdin!.on('error', () => {})
  let stderr = ''
  proc.stderr!.setEncoding('utf8')
  proc.stderr!.on('data', (d: string) => {
    stderr = (stderr + d).slice(-4000)
  })
  let exited = false
  proc.once('exit', () => {
    exited = true
  })
  const anvilPid = await readPid(proc)
  proc.stdout!.resume()
  // with the dir and socket it serves, so a later start kills only this dir's anvil (killStaleAnvil)
  fs.writeFileSync(pidFile, `${anvilPid}\n${dir}\n${ipcPath}\n`)
  const ipc = await connectIpc(
    ipcPath,
    anvilPid,
    ipcTimeoutMs,
    () => exited,
    () => stderr,
  )
  log('anvil started', { pid: anvilPid, ipcPath })
  return { proc, anvilPid, ipc, ipcPath, stderrTail: () => stderr }
}

/** The watchdog prints anvil's pid first. */
function readPid(proc: ChildProcess): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    let out = ''
    const t = setTimeout(() => reject(new Error('embedded chain: anvil watchdog did not start')), 5000)
    proc.stdout!.setEncoding('utf8')
    proc.stdout!.on('data', (d: string) => {
      out += d
      const m = /pid (\d+)/.exec(out)
      if (m) {
        clearTimeout(t)
        resolve(Number(m[1]))
      }
    })
    proc.once('error', (e) => {
      clearTimeout(t)
      reject(e)
    })
  })
}

/** Waits for the IPC socket to answer: loading a large state takes a while. */
async function connectIpc(ipcPath: string, anvilPid: number, ipcTimeoutMs: number, exited: () => boolean, stderr: () => string): Promise<IpcClient> {
  const deadline = Date.now() + 60_000
  for (;;) {
    if (exited() || !pidAlive(anvilPid)) throw new Error(`embedded chain: anvil exited at start: ${stderr().trim().slice(-1000)}`)
    if (fs.existsSync(ipcPath)) {
      let ipc: IpcClient | undefined
      try {
        ipc = await IpcClient.connect(ipcPath, ipcTimeoutMs)
        const r = await ipc.call('eth_chainId', '[]')
        if (!r.error) return ipc
      } catch {
        // not listening yet
      }
      ipc?.close()
    }
    if (Date.now() > deadline) {
      kill(anvilPid, 'SIGKILL')
      throw new Error('embedded chain: anvil did not open its IPC socket within 60 s')
    }
    await sleep(10)
  }
}

export async function stopAnvil(child: Child): Promise<void> {
  child.ipc.close()
  // Once the watchdog has exited it has reaped anvil (it exits after `wait`), and been reaped:
  // their pids may belong to other processes by now (anvil may have died long before).
  const watchdogGone = (): boolean => child.proc.exitCode !== null || child.proc.signalCode !== null
  const exited = new Promise<void>((r) => {
    if (watchdogGone()) r()
    else child.proc.once('exit', () => r())
  })
  child.proc.stdin!.end() // the watchdog kills anvil and exits
  if (!watchdogGone()) kill(child.anvilPid, 'SIGTERM')
  await Promise.race([exited, sleep(3000)])
  // a stuck watchdog, or one killed by a signal (then anvil may be left without it)
  const left = !watchdogGone() ? [child.anvilPid, child.proc.pid ?? 0] : child.proc.signalCode !== null ? [child.anvilPid] : []
  for (const pid of left) {
    if (pid && pidAlive(pid)) kill(pid, 'SIGKILL')
  }
  try {
    fs.unlinkSync(child.ipcPath)
  } catch {}
}

/** What ended the watchdog: its signal, or anvil's (the shell exits with 128+n when signal n killed anvil). */
export function exitSignal(code: number | null, signal: NodeJS.Signals | null): string | null {
  return signal ?? (code !== null && code > 128 ? Object.entries(os.constants.signals).find(([, n]) => n === code - 128)?.[0] : undefined) ?? null
}

/** CPU time (user + system, ms) of a process so far, from /proc (Linux); NaN where that is not there. */
export function processCpuMs(pid: number): number {
  try {
    const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
    return (Number(f[11]) + Number(f[12])) * 10 // clock ticks of 10 ms (USER_HZ 100)
  } catch {
    return Number.NaN
  }
}
