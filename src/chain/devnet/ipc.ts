import * as net from 'node:net'
import { DevnetUnavailableError, type RpcResponse } from './types.js'

type Waiter = { resolve: (r: RpcResponse) => void; reject: (e: Error) => void; method: string; ms: number; deadline: number }

/**
 * Newline-delimited JSON-RPC over anvil's IPC socket; answers may come out of order. A call
 * unanswered past its deadline fails (checked by one sweep timer, not a timer per call: the paid
 * path makes thousands of calls a second).
 */
export class IpcClient {
  private parts: string[] = [] // an unfinished line, in pieces (a state dump is tens of MB)
  private nextId = 1
  private readonly waiting = new Map<number, Waiter>()
  private closed: Error | null = null
  private readonly sweeper: NodeJS.Timeout

  private constructor(
    private readonly sock: net.Socket,
    private readonly timeoutMs: number,
  ) {
    this.sweeper = setInterval(() => this.expire(), Math.max(20, Math.min(1000, timeoutMs / 4)))
    this.sweeper.unref()
    sock.setEncoding('utf8')
    sock.on('data', (chunk: string) => {
      let from = 0
      let nl: number
      while ((nl = chunk.indexOf('\n', from)) >= 0) {
        this.parts.push(chunk.slice(from, nl))
        const line = this.parts.length === 1 ? this.parts[0]! : this.parts.join('')
        this.parts = []
        from = nl + 1
        if (line.trim()) this.dispatch(line)
      }
      if (from < chunk.length) this.parts.push(chunk.slice(from))
    })
    sock.on('error', (e) => this.fail(new DevnetUnavailableError(`embedded chain: anvil IPC connection failed: ${e.message}`)))
    sock.on('close', () => this.fail(new DevnetUnavailableError('embedded chain: anvil IPC connection closed')))
  }

  /** Fail every waiting and future call with `e` (`replace`: even if already failed, for a better reason). */
  fail(e: Error, replace = false): void {
    if (replace || !this.closed) this.closed = e
    clearInterval(this.sweeper)
    for (const w of this.waiting.values()) w.reject(this.closed)
    this.waiting.clear()
  }

  private expire(): void {
    const now = Date.now()
    for (const [id, w] of this.waiting) {
      if (now < w.deadline) continue
      this.waiting.delete(id)
      w.reject(new DevnetUnavailableError(`embedded chain: anvil did not answer ${w.method} within ${w.ms / 1000} s`, true))
    }
  }

  private dispatch(line: string): void {
    let msg: RpcResponse
    try {
      msg = JSON.parse(line) as RpcResponse
    } catch {
      return
    }
    const w = this.waiting.get(msg.id as number)
    if (w) {
      this.waiting.delete(msg.id as number)
      w.resolve(msg)
    }
  }

  static connect(file: string, timeoutMs: number): Promise<IpcClient> {
    return new Promise((resolve, reject) => {
      const sock = net.connect(file)
      sock.once('connect', () => {
        sock.removeListener('error', reject)
        resolve(new IpcClient(sock, timeoutMs))
      })
      sock.once('error', reject)
    })
  }

  /** One call, its params already in JSON; fails after `ms` without an answer. */
  call(method: string, paramsJson: string, ms = this.timeoutMs): Promise<RpcResponse> {
    if (this.closed) return Promise.reject(this.closed)
    const id = this.nextId++
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { resolve, reject, method, ms, deadline: Date.now() + ms })
      this.sock.write(`{"jsonrpc":"2.0","id":${id},"method":${JSON.stringify(method)},"params":${paramsJson}}\n`)
    })
  }

  /** Several calls of one method in one socket write; answers in the order of `paramsJson`. */
  callMany(method: string, paramsJson: string[]): Promise<RpcResponse[]> {
    if (this.closed) return Promise.reject(this.closed)
    const m = JSON.stringify(method)
    let out = ''
    const deadline = Date.now() + this.timeoutMs
    const answers = paramsJson.map((p) => {
      const id = this.nextId++
      out += `{"jsonrpc":"2.0","id":${id},"method":${m},"params":${p}}\n`
      return new Promise<RpcResponse>((resolve, reject) => this.waiting.set(id, { resolve, reject, method, ms: this.timeoutMs, deadline }))
    })
    this.sock.write(out)
    return Promise.all(answers)
  }

  close(): void {
    clearInterval(this.sweeper)
    this.sock.destroy()
  }
}
