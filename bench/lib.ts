import { spawn, type ChildProcess } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { once } from 'node:events'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

/** Small helpers for benchmarks: percentiles and bounded loops. Figures are ratios against a baseline from the same run. */
export function percentile(sorted: number[], p: number): number {
  if (!sorted.length) return NaN
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return sorted[i]!
}

export interface Latencies {
  n: number
  p50: number
  p99: number
}

/** One call of `fn`, timed in ms, added to `into`. */
async function timed(fn: () => Promise<void>, into: number[]): Promise<void> {
  const t0 = process.hrtime.bigint()
  await fn()
  into.push(Number(process.hrtime.bigint() - t0) / 1e6)
}

function latencies(ms: number[]): Latencies {
  ms.sort((a, b) => a - b)
  return { n: ms.length, p50: percentile(ms, 50), p99: percentile(ms, 99) }
}

/** Run `fn` sequentially `count` times (or until `maxMs`), timing each call in ms. */
export async function timeSequential(count: number, maxMs: number, fn: () => Promise<void>): Promise<Latencies> {
  const out: number[] = []
  const end = Date.now() + maxMs
  for (let i = 0; i < count && Date.now() < end; i++) await timed(fn, out)
  return latencies(out)
}

/**
 * Run `a` and `b` alternately `count` times each (or until `maxMs`), timing every call in
 * ms: a slow moment of the machine then touches both series alike.
 */
export async function timeAlternating(count: number, maxMs: number, a: () => Promise<void>, b: () => Promise<void>): Promise<[Latencies, Latencies]> {
  const as: number[] = []
  const bs: number[] = []
  const end = Date.now() + maxMs
  for (let i = 0; i < count && Date.now() < end; i++) {
    await timed(a, as)
    await timed(b, bs)
  }
  return [latencies(as), latencies(bs)]
}

/** `workers` concurrent loops calling `fn` until `count` calls or `maxMs`; returns calls per second. */
export async function throughput(workers: number, count: number, maxMs: number, fn: () => Promise<void>): Promise<{ n: number; perSec: number }> {
  let started = 0
  let done = 0
  const t0 = Date.now()
  const end = t0 + maxMs
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (started < count && Date.now() < end) {
        started++
        await fn()
        done++
      }
    }),
  )
  const secs = (Date.now() - t0) / 1000
  return { n: done, perSec: done / secs }
}

export const fmt = (n: number, d = 2): string => n.toFixed(d)

/** The Node flags `npm start` (package.json) and the Docker image run the gateway with. */
export const START_NODE_ARGS = ['--max-semi-space-size=64']

/**
 * Node flags for the benchmarks' gateways: those of `npm start`; with `BENCH_PROFILE=<dir>` each
 * writes a V8 CPU profile there when it stops; `BENCH_NODE_ARGS` adds any others (space-separated,
 * to try V8 settings; a flag given again there wins), and `extra` after them (the same form).
 */
export const gatewayNodeArgs = (extra = ''): string[] => [
  ...START_NODE_ARGS,
  ...(process.env.BENCH_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE}`] : []),
  ...`${process.env.BENCH_NODE_ARGS ?? ''} ${extra}`.split(' ').filter(Boolean),
]

/**
 * A benchmark's server (`./<script>.ts` here) in its own process, as a real target or merchant
 * would be; resolves once it prints its `{"url": ...}` line.
 */
export async function spawnServer(script: string, env: Record<string, string> = {}): Promise<{ proc: ChildProcess; url: string }> {
  const proc = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(new URL(script, import.meta.url))], {
    cwd: fileURLToPath(new URL('..', import.meta.url)),
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const [line] = (await once(createInterface({ input: proc.stdout! }), 'line')) as [string]
  return { proc, url: (JSON.parse(line) as { url: string }).url }
}

const TICKS_PER_SEC = 100 // USER_HZ: the unit of /proc/<pid>/stat's CPU times on Linux

/** `[ppid, CPU ms used so far]` from a /proc `stat` file (a process's, all its threads; or one thread's), or null once it is gone. */
function statOf(file: string): [number, number] | null {
  let text: string
  try {
    text = readFileSync(file, 'utf8')
  } catch {
    return null
  }
  // Fields after the command name (which may hold spaces): state, ppid, ..., utime (12th), stime (13th).
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ')
  return [Number(f[1]), ((Number(f[11]) + Number(f[12])) * 1000) / TICKS_PER_SEC]
}

const procStat = (pid: number): [number, number] | null => statOf(`/proc/${pid}/stat`)

/** CPU ms used so far by one thread (`tid`) of process `pid`, from /proc; 0 once it is gone. A process's main thread has `tid` = `pid`. */
export function threadCpuMs(pid: number, tid: number): number {
  return statOf(`/proc/${pid}/task/${tid}/stat`)?.[1] ?? 0
}

/** The processes started under `pid`, at any depth (the embedded chain and its watchdog under a gateway). */
export function descendants(pid: number): number[] {
  const parent = new Map<number, number>()
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    const s = procStat(Number(name))
    if (s) parent.set(Number(name), s[0])
  }
  const out: number[] = []
  const todo = [pid]
  while (todo.length) {
    const p = todo.pop()!
    for (const [child, pp] of parent) {
      if (pp !== p) continue
      out.push(child)
      todo.push(child)
    }
  }
  return out
}

/** CPU ms used so far by each named group of processes (`'self'`: this process). */
export function cpuTimes(groups: Record<string, number[] | 'self'>): Record<string, number> {
  const out: Record<string, number> = {}
  for (const [name, pids] of Object.entries(groups)) {
    if (pids === 'self') {
      const u = process.cpuUsage()
      out[name] = (u.user + u.system) / 1000
    } else out[name] = pids.reduce((sum, p) => sum + (procStat(p)?.[1] ?? 0), 0)
  }
  return out
}

/** CPU ms per call of each group between two `cpuTimes` readings, e.g. "gateway 1.012, chain 0.703", and their total. */
export function cpuPerCall(before: Record<string, number>, after: Record<string, number>, calls: number): { text: string; total: number } {
  let total = 0
  const parts = Object.keys(after).map((k) => {
    const ms = (after[k]! - (before[k] ?? 0)) / calls
    total += ms
    return `${k} ${fmt(ms, 3)}`
  })
  return { text: parts.join(', '), total }
}
