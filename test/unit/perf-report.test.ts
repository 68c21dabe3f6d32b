import t from 'tap'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

/**
 * scripts/perf-report.mjs reads `perf script -F comm,pid,tid,ip,sym` output (a header line per
 * sample, then its frames, leaf first, then a blank line) and tells where the main thread's
 * time went. Fed a known set of samples, its shares must be exactly theirs.
 */
const SCRIPT = fileURLToPath(new URL('../../scripts/perf-report.mjs', import.meta.url))

/** One sample of `perf script` output: its thread and its frames, leaf first. */
const sample = (tid: number, frames: string[]): string => `node 100/${tid} \n${frames.map((f, i) => `\t        ${(0x1000 + i).toString(16)} ${f}\n`).join('')}\n`

const engine = 'JS:*payNow file:///srv/paygate/dist/engine/engine.js:252:17'
const handler = 'JS:*handler file:///srv/paygate/dist/api/routes/pay.js:207:26'
const store = 'JS:* file:///srv/paygate/dist/store/write-behind.js:126:32'

function report(text: string, ...args: string[]): { status: number | null; out: string; err: string } {
  const dir = mkdtempSync(join(tmpdir(), 'paygate-perf-report-'))
  try {
    const file = join(dir, 'perf.txt')
    writeFileSync(file, text)
    const r = spawnSync(process.execPath, [SCRIPT, file, ...args], { encoding: 'utf8', timeout: 30_000 })
    return { status: r.status, out: r.stdout, err: r.stderr }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

t.test('shares of threads, of kinds of work, of our outermost functions and of the writes', async (t) => {
  const text = [
    // main thread (100): 4 samples signing under payNow, under the handler
    ...Array.from({ length: 4 }, () => sample(100, ['secp256k1_ecdsa_sign', 'Secp256k1Addon::ECDSASign', engine, handler, 'node::Start'])),
    // 3 in a socket write made by payNow
    ...Array.from({ length: 3 }, () => sample(100, ['__GI___libc_write', 'uv__try_write', engine, 'node::Start'])),
    // 2 in the store's JSON, 1 in our own JIT code with nothing under it
    ...Array.from({ length: 2 }, () => sample(100, ['v8::internal::JsonStringifier::SerializeString', store, 'node::Start'])),
    sample(100, [store, 'node::Start']),
    // another thread (a collector helper): 10 samples
    ...Array.from({ length: 10 }, () => sample(101, ['v8::internal::Scavenger::ScavengeObject', 'start_thread'])),
  ].join('')
  const r = report(text)
  t.equal(r.status, 0, r.err)
  t.match(r.out, /## threads \(20 samples\)\n {1}50\.0% {2}100 node\n {1}50\.0% {2}101 node/, 'each thread half the samples')
  t.match(r.out, /## main thread 100: 50\.0% of the samples/)
  t.match(r.out, / 40\.0% {2}secp256k1 \(signing\)/)
  t.match(r.out, / 30\.0% {2}system call: write/)
  t.match(r.out, / 20\.0% {2}JSON\.stringify/)
  t.match(r.out, / 10\.0% {2}JIT code \(JS\)/)
  t.match(r.out, / 40\.0% {2}handler dist\/api\/routes\/pay\.js/, 'the handler is the outermost of ours over the signing')
  t.match(r.out, / 30\.0% {2}payNow dist\/engine\/engine\.js/, 'payNow outermost where no handler is above it')
  t.match(r.out, / 30\.0% {2}\(anonymous\) dist\/store\/write-behind\.js/, 'an anonymous function named by its file')
  t.match(r.out, /### write\(\) system calls[^\n]*\n {1}30\.0% {2}payNow dist\/engine\/engine\.js/, 'the writes charged to the function that made them')
  t.notMatch(r.out, /Scavenger/, 'the other thread is not in the main thread figures')
})

t.test('the main thread can be named, and bad input is refused', async (t) => {
  const text = sample(100, ['Builtins_LoadIC', engine]) + sample(101, ['v8::internal::Heap::Scavenge', 'start_thread'])
  t.match(report(text, '101').out, /## main thread 101: 50\.0% of the samples[\s\S]*100\.0% {2}garbage collection/)
  const none = report('')
  t.not(none.status, 0)
  t.match(none.err, /no samples/)
  const usage = spawnSync(process.execPath, [SCRIPT], { encoding: 'utf8', timeout: 30_000 })
  t.equal(usage.status, 2)
  t.match(usage.stderr, /usage: node scripts\/perf-report\.mjs/)
})
