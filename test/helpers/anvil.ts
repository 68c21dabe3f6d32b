import { spawn } from 'node:child_process'
import { anvilBinary } from '../../src/chain/devnet/anvil.js'
import { freePort } from './ports.js'

/**
 * A standalone anvil (the npm package's binary, as the embedded chain uses) on a free loopback
 * port, mining each transaction at once: the "external chain" that replicas share. Stopped by
 * its own pid.
 */
export interface Anvil {
  url: string
  pid: number
  request<T = unknown>(method: string, params?: unknown[]): Promise<T>
  stop(): void
}

/** `args`: more anvil flags (a bench mines blocks on an interval, as the embedded chain does, instead of one per transaction). */
export async function startAnvil(chainId = 31338, args: string[] = []): Promise<Anvil> {
  const port = await freePort()
  const proc = spawn(anvilBinary(), ['--silent', '--host', '127.0.0.1', '--port', String(port), '--chain-id', String(chainId), ...args], { stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  proc.stderr.on('data', (d: Buffer) => (stderr += d))
  const url = `http://127.0.0.1:${port}`
  let stopped = false
  const stop = (): void => {
    if (stopped) return
    stopped = true
    process.removeListener('exit', stop)
    try {
      process.kill(proc.pid!, 'SIGKILL')
    } catch {
      /* already gone */
    }
  }
  process.once('exit', stop)
  let id = 0
  const request = async <T>(method: string, params: unknown[] = []): Promise<T> => {
    const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: ++id, method, params }) })
    const j = (await res.json()) as { result?: T; error?: { message: string } }
    if (j.error) throw new Error(`${method}: ${j.error.message}`)
    return j.result as T
  }
  // Up within 100 tries, 100 ms apart.
  for (let i = 0; ; i++) {
    if (proc.exitCode !== null) throw new Error(`anvil exited (${proc.exitCode}): ${stderr}`)
    try {
      await request('eth_chainId')
      break
    } catch (e) {
      if (i === 100) {
        stop()
        throw new Error(`anvil did not answer on ${url}: ${(e as Error).message} ${stderr}`)
      }
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  return { url, pid: proc.pid!, request, stop }
}
