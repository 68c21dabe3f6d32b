import { spawn, type ChildProcess } from 'node:child_process'
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

/** `BENCH_PROFILE=<dir>`: each benchmark's gateway process writes a V8 CPU profile there when it stops. */
export const gatewayNodeArgs = (): string[] => (process.env.BENCH_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE}`] : [])

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
