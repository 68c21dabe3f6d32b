import { moduleThread } from '../../util/thread.js'
import { type Devnet, type DevnetLog, type DevnetOptions, type DevnetStats, DevnetUnavailableError, type SendResult } from './types.js'

/**
 * The embedded chain on a thread of its own. Its JSON-RPC front (the sends' journal, the
 * receipt archive, the IPC to anvil, the HTTP server merchants read through) otherwise runs on
 * the gateway's main thread, which bounds the gateway's paid calls a second
 * (docs/benchmarks.md); on its own thread it costs that thread one message a call instead.
 * The handle is the same `Devnet` as startDevnet's, except `stats()`: as of the last second (or
 * the last send, snapshot or close).
 */

export type Call =
  | { id: number; op: 'request'; arg: { method: string; params?: unknown[] | object } }
  | { id: number; op: 'send'; arg: string[] }
  | { id: number; op: 'sendLedger'; arg: { from: string; raws: string[] } }
  | { id: number; op: 'probeUnsigned'; arg: { from: string; raw: string } }
  | { id: number; op: 'snapshot' | 'close'; arg?: undefined }

export interface ThreadError {
  name: string
  message: string
  code?: unknown
  data?: unknown
  timedOut?: boolean
}

export type FromThread =
  | { t: 'ready'; rpcUrl: string; chainId: number; childPid: number; stats: DevnetStats }
  | { t: 'failed'; error: ThreadError }
  | { t: 'log'; msg: string; fields?: object; level?: 'warn' | 'error' }
  | { t: 'stats'; stats: DevnetStats }
  | { t: 'reply'; id: number; value?: unknown; error?: ThreadError; stats?: DevnetStats }

/** An error as it crosses to the other thread: what callers read of it (viem reads `code` and `data`). */
export function errorOf(e: unknown): ThreadError {
  const x = e as { name?: unknown; message?: unknown; code?: unknown; data?: unknown; timedOut?: unknown }
  return {
    name: typeof x?.name === 'string' ? x.name : 'Error',
    message: typeof x?.message === 'string' ? x.message : String(e),
    ...(x?.code !== undefined ? { code: x.code } : {}),
    ...(x?.data !== undefined ? { data: x.data } : {}),
    ...(x?.timedOut === true ? { timedOut: true } : {}),
  }
}

function rebuilt(e: ThreadError): Error {
  if (e.name === 'DevnetUnavailableError') return new DevnetUnavailableError(e.message, e.timedOut === true)
  return Object.assign(new Error(e.message), { ...(e.code !== undefined ? { code: e.code } : {}), ...(e.data !== undefined ? { data: e.data } : {}) })
}

export async function startDevnetThread(opts: DevnetOptions): Promise<Devnet> {
  const { log: given, ...data } = opts
  const log: DevnetLog = given ?? ((): void => {})
  const thread = moduleThread(import.meta.url, 'thread-worker', { workerData: data })
  const waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>()
  let next = 0
  let stats: DevnetStats
  let stopped: Error | null = null
  let closing = false
  let started: (m: FromThread & { t: 'ready' }) => void
  let startFailed: (e: Error) => void
  const ready = new Promise<FromThread & { t: 'ready' }>((resolve, reject) => {
    started = resolve
    startFailed = reject
  })

  thread.on('message', (m: FromThread) => {
    if (m.t === 'log') log(m.msg, m.fields, m.level)
    else if (m.t === 'stats') stats = m.stats
    else if (m.t === 'reply') {
      const w = waiting.get(m.id)
      if (!w) return
      waiting.delete(m.id)
      if (m.stats) stats = m.stats
      if (m.error) w.reject(rebuilt(m.error))
      else w.resolve(m.value)
    } else if (m.t === 'ready') {
      stats = m.stats
      started(m)
    } else stop(rebuilt(m.error))
  })
  const stop = (e: Error): void => {
    stopped ??= e
    startFailed(e)
    for (const w of waiting.values()) w.reject(e)
    waiting.clear()
  }
  thread.on('error', (e) => {
    log('the embedded chain thread failed', { error: String(e) }, 'error')
    stop(new DevnetUnavailableError(`embedded chain: its thread failed (${e.message}); restart Paygate`))
  })
  const exited = new Promise((resolve) => thread.once('exit', resolve))
  thread.on('exit', (code) => {
    if (!closing && !stopped) log('the embedded chain thread exited', { code }, 'error')
    stop(new DevnetUnavailableError(closing ? 'embedded chain is closed' : `embedded chain: its thread exited (${code}); restart Paygate`))
  })

  const call = <T>(op: Call['op'], arg?: unknown): Promise<T> => {
    if (stopped) return Promise.reject(stopped)
    const id = next++
    return new Promise<T>((resolve, reject) => {
      waiting.set(id, { resolve: resolve as (v: unknown) => void, reject })
      thread.postMessage({ id, op, arg })
    })
  }

  const r = await ready
  let closed: Promise<void> | undefined
  return {
    rpcUrl: r.rpcUrl,
    chainId: r.chainId,
    childPid: r.childPid,
    request: (a) => call('request', a),
    sendRawTransactions: (raws) => call<SendResult[]>('send', raws),
    sendLedger: (from, raws) => call<SendResult[]>('sendLedger', { from, raws }),
    probeUnsigned: (from, raw) => call<string>('probeUnsigned', { from, raw }),
    stats: () => stats,
    snapshot: () => call<void>('snapshot'),
    close: () =>
      (closed ??= (async () => {
        let failed: unknown
        if (!stopped) {
          closing = true
          // The thread ends after its close either way; a close that failed is reported once it has.
          await call<void>('close').catch((e: unknown) => (failed = e))
        }
        await exited
        if (failed) throw failed
      })()),
  }
}
