import { spawn, type ChildProcess } from 'node:child_process'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL('../..', import.meta.url))

/** Keep each test's CA inside its own data directory. */
const certsIn = (env: Record<string, string>): Record<string, string> => (env.PAYGATE_DATA_DIR ? { PAYGATE_CERTS_DIR: join(env.PAYGATE_DATA_DIR, 'certs') } : {})

export interface GatewayProcess {
  proc: ChildProcess
  url: string
  stdout: string[]
  stderr: string[]
  /** Resolves with the exit code (or signal name) once the process has exited. */
  exited: Promise<number | string>
  /** `cutMs`: how long a shutdown may take before it is cut with a SIGKILL (a CPU profile takes a while to write). */
  stop(signal?: NodeJS.Signals, cutMs?: number): Promise<number | string>
}

/**
 * The gateway's entry: the sources through tsx (tests), or with `PAYGATE_SPAWN_BUILT=1` the build
 * `npm start` runs (benchmarks measure that; they build it first), with `=modules` the same
 * build unbundled (`dist/main.js`: profiles name each module's file).
 */
const BUILT_ENTRY: Record<string, string[]> = { '1': ['dist/paygate.js'], modules: ['dist/main.js'] }
const entry = (): string[] => BUILT_ENTRY[process.env.PAYGATE_SPAWN_BUILT ?? ''] ?? ['--import', 'tsx', 'src/main.ts']

/** Run `paygate start` as a real child process and wait until it prints its API address (within `startMs`). */
export async function spawnGateway(env: Record<string, string>, args: string[] = [], nodeArgs: string[] = [], keepStdout = true, startMs = 20_000): Promise<GatewayProcess> {
  const proc = spawn(process.execPath, [...nodeArgs, ...entry(), ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', PAYGATE_API_PORT: '0', PAYGATE_PROXY_PORT: '0', PAYGATE_CHAIN_RPC_PORT: '0', ...certsIn(env), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const stdout: string[] = []
  const stderr: string[] = []
  const exited = new Promise<number | string>((resolve) => proc.on('exit', (code, sig) => resolve(code ?? sig ?? -1)))
  // SPAWN_TIMEOUT_MS: a longer wait for the start line on a machine loaded by other work.
  const waitMs = Math.max(startMs, Number(process.env.SPAWN_TIMEOUT_MS ?? 0))
  const url = await new Promise<string>((resolve, reject) => {
    let buf = ''
    let started = false
    proc.stdout!.on('data', (d: Buffer) => {
      // Benchmarks share this process with a target under load: past the start line, their gateway's lines are only drained.
      if (started && !keepStdout) return
      buf += d.toString()
      let i: number
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i)
        buf = buf.slice(i + 1)
        stdout.push(line)
        // Parsing stops once started: benchmarks share this process with a target under load.
        if (started) continue
        try {
          const j = JSON.parse(line)
          if (j.msg === 'paygate started') {
            started = true
            resolve(j.api)
          }
        } catch {
          /* not JSON */
        }
      }
    })
    proc.stderr!.on('data', (d: Buffer) => stderr.push(...d.toString().split('\n').filter(Boolean)))
    exited.then((c) => reject(new Error(`gateway exited (${c}) before starting: ${stderr.join('\n')}`)))
    setTimeout(() => {
      if (started) return
      // Never leave a gateway behind that did not come up (e.g. its start line was filtered by the log level).
      proc.kill('SIGKILL')
      reject(new Error(`gateway did not start within ${waitMs / 1000} s`))
    }, waitMs).unref()
  })
  return {
    proc,
    url,
    stdout,
    stderr,
    exited,
    async stop(signal: NodeJS.Signals = 'SIGTERM', cutMs = 15_000) {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal)
      // Never leave a gateway behind: a shutdown that hangs is cut (after 15 s by default).
      const cut = setTimeout(() => proc.kill('SIGKILL'), cutMs)
      const code = await exited
      clearTimeout(cut)
      return code
    },
  }
}

/** Run the CLI to completion and collect its output. */
export function runCli(env: Record<string, string>, args: string[], timeoutMs = 20_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const proc = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', ...args], {
      cwd: ROOT,
      env: { PATH: process.env.PATH ?? '', ...certsIn(env), ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    proc.stdout.on('data', (d) => (stdout += d))
    proc.stderr.on('data', (d) => (stderr += d))
    const timer = setTimeout(() => proc.kill('SIGKILL'), timeoutMs)
    proc.on('exit', (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })
}

export async function call(url: string, method: string, path: string, key: string | null, body?: unknown): Promise<{ status: number; body: any; text: string; headers: Record<string, string> }> {
  const headers: Record<string, string> = {}
  if (key) headers.authorization = `Bearer ${key}`
  if (body !== undefined) headers['content-type'] = 'application/json'
  const res = await fetch(url + path, { method, headers, ...(body !== undefined ? { body: JSON.stringify(body) } : {}) })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : undefined, text, headers: Object.fromEntries(res.headers) }
}
