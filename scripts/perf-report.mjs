#!/usr/bin/env node
/**
 * Where a gateway's CPU went, on CPU only, from Linux `perf` samples with JIT symbols (the
 * recipe is in docs/benchmarks.md, "On-CPU profiles with perf"). A V8 `.cpuprofile` samples
 * wall time: a thread preempted inside a socket write (the woken reader takes the core) is
 * charged there too (writes: 20% of a V8 profile's busy samples, 14% of the main thread's CPU).
 *
 *   node scripts/perf-report.mjs <perf script output> [main thread id]
 *
 * The input is `perf script -F comm,pid,tid,ip,sym`. Prints each thread's share of the
 * samples, then for the main thread (the process's own id unless given): its time by kind
 * (our JS, V8, GC, system calls, crypto, ...), by the outermost function of ours on the
 * stack (what each part of a paid call costs, all it calls included), and its socket and
 * file writes by the function of ours that made them.
 */
import { readFileSync } from 'node:fs'

const [file, mainArg] = process.argv.slice(2)
if (!file) {
  console.error('usage: node scripts/perf-report.mjs <perf script -F comm,pid,tid,ip,sym output> [main tid]')
  process.exit(2)
}

/** Samples as { comm, pid, tid, frames (leaf first) }. */
function parse(text) {
  const out = []
  let cur = null
  for (const line of text.split('\n')) {
    if (!line.trim()) {
      if (cur) out.push(cur)
      cur = null
      continue
    }
    if (!/^\s/.test(line)) {
      const m = /^(.*?)\s+(\d+)\/(\d+)\s*$/.exec(line)
      cur = m ? { comm: m[1].trim(), pid: m[2], tid: m[3], frames: [] } : null
      continue
    }
    const sym = line.trim().split(' ').slice(1).join(' ') || '?'
    cur?.frames.push(sym.replace(/file:\/\/\/\S*?\/(dist|src|node_modules)\//, '$1/'))
  }
  if (cur) out.push(cur)
  return out
}

const samples = parse(readFileSync(file, 'utf8'))
if (!samples.length) throw new Error(`no samples in ${file}`)
const pct = (n, of) => `${((100 * n) / of).toFixed(1).padStart(5)}%`
const top = (counts, of, n = 20) =>
  [...counts]
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .map(([k, v]) => `${pct(v, of)}  ${k}`)
    .join('\n')
const count = (xs, key) => {
  const m = new Map()
  for (const x of xs) {
    const k = key(x)
    if (k !== null) m.set(k, (m.get(k) ?? 0) + 1)
  }
  return m
}

console.log(`## threads (${samples.length} samples)`)
console.log(
  top(
    count(samples, (s) => `${s.tid} ${s.comm}`),
    samples.length,
    12,
  ),
)

const mainTid = mainArg ?? samples[0].pid
const main = samples.filter((s) => s.tid === mainTid)
console.log(`\n## main thread ${mainTid}: ${pct(main.length, samples.length).trim()} of the samples`)

const ours = (f) => /^JS:.*\b(dist|src)\//.test(f)
/** What kind of work a sample is, from its whole stack (first match wins). */
function kind(frames) {
  const s = frames.join(' | ')
  const leaf = frames[0]
  if (/Scavenge|MarkCompact|Heap::CollectGarbage|IncrementalMarking|ConcurrentMarking/.test(s)) return 'garbage collection'
  if (/ECDSASign|secp256k1/.test(s)) return 'secp256k1 (signing)'
  if (/Keccak/.test(s)) return 'keccak'
  if (/__GI___libc_write|writev/.test(s)) return 'system call: write (sockets, the log)'
  if (/tcp_recvmsg|sock_read|uv__read.*\| read\b/.test(s) || /^read$/.test(leaf)) return 'system call: read'
  if (/epoll/.test(s)) return 'epoll'
  if (/leveldb|classic-level|snappy/.test(s)) return 'LevelDB'
  if (/JsonStringifier/.test(s)) return 'JSON.stringify'
  if (/JsonParse/.test(s)) return 'JSON.parse'
  if (/^(JS|Builtin):/.test(leaf)) return 'JIT code (JS)'
  if (/^Builtins_/.test(leaf)) return 'V8 builtins (property access, calls, promises, Map)'
  if (/^v8::/.test(leaf)) return 'V8 runtime'
  if (/^(node::|uv_|uv__)/.test(leaf)) return 'Node and libuv (C++)'
  if (/malloc|free|unlink_chunk|memmove|memcpy|memcmp|memset/.test(leaf)) return 'libc (memory)'
  return 'other (kernel and the rest)'
}
console.log('\n### by kind')
console.log(
  top(
    count(main, (s) => kind(s.frames)),
    main.length,
    20,
  ),
)

const name = (f) =>
  f
    .replace(/^JS:[*^~]?/, '')
    .replace(/:\d+:\d+$/, '')
    .replace(/^ /, '(anonymous) ')
console.log('\n### by the outermost function of ours on the stack (everything it calls included)')
console.log(
  top(
    count(main, (s) => {
      const f = s.frames.findLast(ours)
      return f ? name(f) : '(none of ours: Node internals, GC, the event loop)'
    }),
    main.length,
    25,
  ),
)

console.log('\n### write() system calls, by the innermost function of ours that made them')
const writes = main.filter((s) => s.frames.some((f) => f.includes('__GI___libc_write')))
console.log(
  top(
    count(writes, (s) => name(s.frames.find(ours) ?? '(none of ours)')),
    main.length,
    10,
  ),
)
