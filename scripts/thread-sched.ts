/**
 * How the scheduler treats one process's main thread, once a second (issue 28): the share of the
 * second it ran, the share it was runnable but waiting for a core (`/proc/<pid>/task/<pid>/schedstat`),
 * its involuntary and voluntary context switches, and how idle the machine's cores were
 * (`/proc/stat`). Linux only; reads /proc, touches nothing. Run it beside `npm run bench pay`:
 *
 *   npx tsx scripts/thread-sched.ts <pid> [--seconds 30]
 *
 * A thread that is runnable and waiting while cores sit idle is being passed over (docs/benchmarks.md,
 * "The scheduler").
 */
import * as fs from 'node:fs'
import * as os from 'node:os'

const argv = process.argv.slice(2)
const pid = Number(argv[0])
const at = argv.indexOf('--seconds')
const seconds = at >= 0 ? Number(argv[at + 1]) : 30
if (!Number.isInteger(pid) || pid <= 0 || !(seconds > 0)) {
  console.error('usage: npx tsx scripts/thread-sched.ts <pid> [--seconds 30]')
  process.exit(2)
}

interface Sample {
  runNs: number
  waitNs: number
  involuntary: number
  voluntary: number
  idleTicks: number
  allTicks: number
}

function sample(): Sample {
  const [run, wait] = fs.readFileSync(`/proc/${pid}/task/${pid}/schedstat`, 'utf8').trim().split(/\s+/).map(Number)
  const status = fs.readFileSync(`/proc/${pid}/task/${pid}/status`, 'utf8')
  const field = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? Number.NaN)
  // cpu  user nice system idle iowait irq softirq steal ...
  const cpu = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1, 9).map(Number)
  return {
    runNs: run!,
    waitNs: wait!,
    involuntary: field('nonvoluntary_ctxt_switches'),
    voluntary: field('voluntary_ctxt_switches'),
    idleTicks: cpu[3]! + cpu[4]!,
    allTicks: cpu.reduce((a, b) => a + b, 0),
  }
}

const cores = os.availableParallelism()
const pct = (x: number): string => `${(100 * x).toFixed(1).padStart(5)}%`
let prev = sample()
let prevAt = process.hrtime.bigint()
console.log(`pid ${pid}, ${cores} cores: per second, the main thread's run and runnable-wait shares, its context switches, and the cores' idle share`)
for (let i = 0; i < seconds; i++) {
  await new Promise((r) => setTimeout(r, 1000))
  let cur: Sample
  try {
    cur = sample()
  } catch {
    console.log(`pid ${pid} is gone`)
    break
  }
  const now = process.hrtime.bigint()
  const wallNs = Number(now - prevAt)
  const ticks = cur.allTicks - prev.allTicks
  console.log(
    `run ${pct((cur.runNs - prev.runNs) / wallNs)}  wait ${pct((cur.waitNs - prev.waitNs) / wallNs)}  ` +
      `involuntary ${String(cur.involuntary - prev.involuntary).padStart(5)}  voluntary ${String(cur.voluntary - prev.voluntary).padStart(5)}  ` +
      `cores idle ${pct(ticks > 0 ? (cur.idleTicks - prev.idleTicks) / ticks : 0)}`,
  )
  prev = cur
  prevAt = now
}
