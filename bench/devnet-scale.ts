/**
 * The embedded chain at scale (`npm run bench devnet-scale`; BENCH_DEVNET_RECORDS, default
 * 1,000,000; BENCH_DEVNET_MAX_S, default 1500): a worker process starts the chain in a temp dir,
 * deploys the PaymentLedger and fills it with ledger records (unsigned, sent 250 to a call the
 * way the outbox sends them to the embedded chain, at most 1,000 unmined; BENCH_DEVNET_SIGNED=1:
 * signed natively, as for an external chain), printing per 10,000 records the CPU of anvil
 * (/proc/<pid>/stat) and of the worker, the longest send and snapshot hold, and RSS. Beside
 * the fill a probe sends one plain transfer at a time, every 50 ms, from an account of its own:
 * its latencies (p50, p99, max per 10,000 records) are how long the chain kept a
 * single send waiting, its stalls. At the target (or the time limit) this process SIGKILLs the
 * worker mid-traffic, starts the chain again on its data dir (the restart a crash costs), checks
 * that no acknowledged record was lost (every one mined within 10 s), and checks sampled
 * records, old ones too, from their receipts' events against the contract. Loopback only;
 * bounded in records and time.
 *
 *   npx tsx bench/devnet-scale.ts [--records 1000000] [--max-s 1500]
 */
import { type ChildProcess, spawn } from 'node:child_process'
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { encodeFunctionData, type Abi, type Hex } from 'viem'
import { mnemonicToAccount } from 'viem/accounts'
import { DEVNET_MNEMONIC, type Devnet, startDevnet } from '../src/chain/devnet/index.js'
import type { DevnetLog } from '../src/chain/devnet/types.js'
import { signEip1559 } from '../src/chain/eip1559.js'
import { encodeRecordCall } from '../src/chain/ledger-call.js'
import { keccak256Bytes } from '../src/crypto/keccak.js'
import { LedgerSigner } from '../src/chain/ledger-signer.js'
import { entryOf } from './ledger-entries.js'
import { FastSigner } from '../src/crypto/secp256k1.js'

const artifacts = JSON.parse(fs.readFileSync(new URL('../src/chain/contracts/artifacts.json', import.meta.url), 'utf8')) as {
  PaymentLedger: { abi: Abi; bytecode: Hex }
}
const { abi, bytecode } = artifacts.PaymentLedger
const CHAIN_ID = 31337
const WINDOW = 10_000
const BATCH = 250
const MAX_UNMINED = 1000

const arg = (name: string, dflt: number): number => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : dflt
}

const account = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 1 })
const hd = account.getHdKey()
const signer = new FastSigner(`0x${Buffer.from(hd.privateKey!).toString('hex')}`)

/** Records as the outbox makes them for the embedded chain: unsigned, from the account impersonated (BENCH_DEVNET_SIGNED=1: signed). */
const SIGNED = process.env.BENCH_DEVNET_SIGNED === '1'
const recordTx = new LedgerSigner(signer)

const sign = (data: Uint8Array, to: Uint8Array, nonce: number, gas: bigint, by = signer): Hex => {
  const raw = signEip1559({ chainId: CHAIN_ID, nonce: BigInt(nonce), gas, maxFeePerGas: 100_000_000_000n, maxPriorityFeePerGas: 1n, to, value: 0n, data }, (p) => by.signDigestBytes(keccak256Bytes(p)))
  return `0x${raw.toString('hex')}`
}

/** The probe: one plain transfer at a time from an account of its own, every PROBE_EVERY_MS, beside the fill. */
const probeSigner = new FastSigner(`0x${Buffer.from(mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 2 }).getHdKey().privateKey!).toString('hex')}`)
const PROBE_TO = Buffer.from('00000000000000000000000000000000000000aa', 'hex')
const PROBE_EVERY_MS = 50

/** A single tx's send, every PROBE_EVERY_MS: how long the chain keeps one waiting (its stalls), while the fill goes on. */
function startProbe(d: Devnet): { take(): number[]; stop(): void } {
  let nonce = 0
  let busy = false
  let ms: number[] = []
  const timer = setInterval(() => {
    if (busy) return
    busy = true
    const raw = sign(new Uint8Array(), PROBE_TO, nonce++, 21_000n, probeSigner)
    const t = performance.now()
    d.sendRawTransactions([raw])
      .then((rs) => {
        if (!('hash' in rs[0]!)) throw new Error(`probe send refused: ${JSON.stringify(rs[0])}`)
        ms.push(performance.now() - t)
      })
      .catch((e: unknown) => out({ t: 'probe-error', error: String(e) }))
      .finally(() => {
        busy = false
      })
  }, PROBE_EVERY_MS)
  return {
    take: () => {
      const taken = ms.sort((a, b) => a - b)
      ms = []
      return taken
    },
    stop: () => clearInterval(timer),
  }
}
const pct = (xs: number[], p: number): number => Math.round(xs[Math.min(xs.length - 1, Math.floor(p * (xs.length - 1)))] ?? 0)

const procCpuMs = (pid: number): number => {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
  return ((Number(f[11]) + Number(f[12])) * 1000) / 100 // utime + stime, in clock ticks of 10 ms
}
const rssMb = (pid: number): number => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024
const selfCpuMs = (): number => {
  const u = process.cpuUsage()
  return (u.user + u.system) / 1000
}
/** The last `k` of `xs` (none for 0). */
const newest = (xs: number[], k: number): number[] => (k > 0 ? xs.slice(-Math.min(50, k)) : [])
const out = (o: object): void => {
  process.stdout.write(`${JSON.stringify(o)}\n`)
}

async function waitReceipt(d: Devnet, hash: Hex): Promise<{ contractAddress?: Hex; status: string }> {
  for (let until = Date.now() + 60_000; Date.now() < until; await new Promise((r) => setTimeout(r, 10))) {
    const r = (await d.request({ method: 'eth_getTransactionReceipt', params: [hash] })) as { contractAddress?: Hex; status: string } | null
    if (r) return r
  }
  throw new Error(`no receipt for ${hash}`)
}

/** The worker: fills the chain until killed (or its own time limit). */
async function worker(dir: string, records: number, maxS: number): Promise<void> {
  const deadline = Date.now() + maxS * 1000
  // trims (with where their time went) and anything that went wrong, for the driver to print
  const log: DevnetLog = (msg, fields, level) => {
    if (msg === 'chain: old block headers trimmed' || level === 'warn' || level === 'error') out({ t: 'log', msg, ...fields })
  }
  const d = await startDevnet({ dataDir: dir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, log })
  let nonce = 0
  // a contract creation (no `to`): signed by viem, once
  const deploy = await account.signTransaction({ chainId: CHAIN_ID, type: 'eip1559', data: bytecode, nonce: nonce++, gas: 5_000_000n, maxFeePerGas: 100_000_000_000n, maxPriorityFeePerGas: 1n })
  const deployHash = (await d.request({ method: 'eth_sendRawTransaction', params: [deploy] })) as Hex
  const r = await waitReceipt(d, deployHash)
  if (!r.contractAddress) throw new Error('no ledger address')
  out({ t: 'ledger', address: r.contractAddress, anvilPid: d.childPid })
  const to = Buffer.from(r.contractAddress.slice(2), 'hex')
  const ctx = { chainId: CHAIN_ID, ledger: r.contractAddress, maxFeePerGas: 100_000_000_000n, maxPriorityFeePerGas: 1n }
  let acked = 0
  const probe = startProbe(d)
  let win = { anvil: procCpuMs(d.childPid), self: selfCpuMs(), maxSendMs: 0, snaps: d.stats().snapshots ?? 0, t: performance.now() }
  while (Date.now() < deadline) {
    const raws: Hex[] = []
    for (let k = 0; k < BATCH; k++) raws.push(SIGNED ? sign(encodeRecordCall(entryOf(acked + k)), to, nonce++, 200_000n) : recordTx.unsigned(ctx, entryOf(acked + k), BigInt(nonce++)).raw)
    const t = performance.now()
    const rs = await d.sendLedger(signer.address, raws)
    const sendMs = performance.now() - t
    if (rs.some((x) => !('hash' in x))) throw new Error(`send refused: ${JSON.stringify(rs.find((x) => !('hash' in x)))}`)
    const first = (rs[0] as { hash: Hex }).hash
    acked += raws.length
    win.maxSendMs = Math.max(win.maxSendMs, sendMs)
    out({ t: 'acked', n: acked, ...(acked % WINDOW === BATCH ? { sample: first, i: acked - BATCH } : {}) })
    if (acked % WINDOW === 0) {
      const s = d.stats()
      const anvil = procCpuMs(d.childPid)
      const self = selfCpuMs()
      out({
        t: 'window',
        n: acked,
        anvilCpuMsPerRecord: +((anvil - win.anvil) / WINDOW).toFixed(4),
        workerCpuMsPerRecord: +((self - win.self) / WINDOW).toFixed(4),
        recordsPerS: Math.round(WINDOW / ((performance.now() - win.t) / 1000)),
        maxSendMs: Math.round(win.maxSendMs),
        probeSendMs: ((p) => ({ n: p.length, p50: pct(p, 0.5), p99: pct(p, 0.99), max: pct(p, 1) }))(probe.take()),
        snapshots: (s.snapshots ?? 0) - win.snaps,
        snapshotsHeldMs: newest(s.snapshotMs, (s.snapshots ?? 0) - win.snaps),
        snapshotsAnvilCpuMs: newest(s.snapshotCpuMs ?? [], (s.snapshots ?? 0) - win.snaps),
        mineMs: s.mineMs,
        rssMb: { node: Math.round(process.memoryUsage().rss / 2 ** 20), anvil: Math.round(rssMb(d.childPid)) },
      })
      win = { anvil, self, maxSendMs: 0, snaps: s.snapshots ?? 0, t: performance.now() }
      if (acked === records) out({ t: 'done', n: acked })
    }
    // backpressure: at most MAX_UNMINED acknowledged and not yet mined
    for (;;) {
      const mined = Number(await d.request({ method: 'eth_getTransactionCount', params: [signer.address, 'latest'] }))
      if (nonce - mined <= MAX_UNMINED) break
      await new Promise((res) => setTimeout(res, 20))
    }
  }
  probe.stop()
  out({ t: 'timeout', n: acked })
}

type Line = { t: string; n?: number; sample?: Hex; i?: number; address?: Hex; anvilPid?: number } & Record<string, unknown>

/** The driver: runs the worker, kills it, restarts the chain on its data dir and checks it. */
async function driver(records: number, maxS: number): Promise<void> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'paygate-devnet-scale-'))
  const run = await runWorker(dir, records, maxS)
  const after = await restartAndCheck(dir, run)
  fs.rmSync(dir, { recursive: true, force: true })
  report(run, after)
}

/** What the worker told before it was killed. */
interface WorkerRun {
  windows: Line[]
  samples: { hash: Hex; i: number }[]
  acked: number
  ledger: Hex
}

/** The worker run to its target (or time limit) and SIGKILLed there, its windows printed as they come. */
async function runWorker(dir: string, records: number, maxS: number): Promise<WorkerRun> {
  const self = fileURLToPath(import.meta.url)
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', self, '--worker', dir, '--records', String(records), '--max-s', String(maxS)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const windows: Line[] = []
  const samples: { hash: Hex; i: number }[] = []
  let acked = 0
  let ledger: Hex | undefined
  let anvilPid = 0
  const ended = new Promise<void>((r) => child.once('exit', () => r()))
  const lines = createInterface({ input: child.stdout! })
  const t0 = Date.now()
  let killed = false
  const kill = (): void => {
    if (!killed && child.pid) {
      killed = true
      process.kill(child.pid, 'SIGKILL')
    }
  }
  const guard = setTimeout(kill, (maxS + 60) * 1000)
  for await (const text of lines) {
    const l = JSON.parse(text) as Line
    if (l.t === 'ledger') {
      ledger = l.address
      anvilPid = l.anvilPid!
    } else if (l.t === 'acked') {
      acked = l.n!
      if (l.sample) samples.push({ hash: l.sample, i: l.i! })
    } else if (l.t === 'probe-error' || l.t === 'log') console.log(JSON.stringify(l))
    else if (l.t === 'window') {
      windows.push(l)
      console.log(`${l.n} records (${Math.round((Date.now() - t0) / 1000)} s): ${JSON.stringify(l)}`)
    }
    // killed mid-traffic: the worker is still sending
    if (l.t === 'done' || l.t === 'timeout') kill()
  }
  await ended
  clearTimeout(guard)
  if (!ledger || !windows.length) throw new Error('the worker stopped before it recorded a window')
  // the watchdog kills anvil when the worker dies
  for (let i = 0; i < 100 && anvilPid && fs.existsSync(`/proc/${anvilPid}`); i++) await new Promise((r) => setTimeout(r, 50))
  return { windows, samples, acked, ledger }
}

/** What the restart cost and what the restarted chain holds. */
interface AfterRestart {
  restartMs: number
  rssAfterRestart: { node: number; anvil: number }
  /** The ledger's count once every acknowledged record was mined (or 10 s passed). */
  count: number
  minedAfterRestartMs: number
  verified: number
}

/** An eth_call of the ledger contract. */
type LedgerCall = (functionName: string, args?: unknown[]) => Promise<Hex>

/** The chain started again on the killed worker's data dir, timed, then checked: every acknowledged record mined, the sampled ones verified. */
async function restartAndCheck(dir: string, run: WorkerRun): Promise<AfterRestart> {
  const { acked, ledger } = run
  const t = performance.now()
  // what the restart spent (snapshot load, journal replay)
  const log = (msg: string, fields?: object): void => {
    if (msg === 'embedded chain ready') console.log(`restart: ${JSON.stringify(fields)}`)
  }
  const d = await startDevnet({ dataDir: dir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, log })
  const restartMs = Math.round(performance.now() - t)
  const rssAfterRestart = { node: Math.round(process.memoryUsage().rss / 2 ** 20), anvil: Math.round(rssMb(d.childPid)) }
  const call: LedgerCall = async (functionName, args = []) =>
    (await d.request({ method: 'eth_call', params: [{ to: ledger, data: encodeFunctionData({ abi, functionName, args }) }, 'latest'] })) as Hex
  // what the journal held unmined at the kill is sent again by the replay and mined in the next block
  let count = Number(BigInt(await call('count')))
  const minedBy = Date.now() + 10_000
  while (count < acked && Date.now() < minedBy) {
    await new Promise((r) => setTimeout(r, 50))
    count = Number(BigInt(await call('count')))
  }
  const minedAfterRestartMs = Math.round(performance.now() - t) - restartMs
  const verified = await verifySamples(d, call, run)
  await d.close()
  return { restartMs, rssAfterRestart, count, minedAfterRestartMs, verified }
}

/** How many of the sampled records verify; each that does not is printed, with what was wrong. */
async function verifySamples(d: Devnet, call: LedgerCall, run: WorkerRun): Promise<number> {
  const { samples, ledger } = run
  // every sampled record, the oldest first: its receipt (from anvil or the archive) holds the event, whose digest the contract computes alike
  const { recordedEvents, recordDigest } = await import('../src/chain/ledger-verify.js')
  let verified = 0
  for (const s of samples) {
    const r = (await d.request({ method: 'eth_getTransactionReceipt', params: [s.hash] })) as { logs: { address: string; topics: Hex[]; data: Hex }[]; blockNumber?: Hex } | null
    const ev = r ? recordedEvents(r.logs, ledger)[0] : undefined
    // A sample that does not verify is named, with what was wrong, so that it can be looked into.
    const unverified = (why: string): void => console.log(`unverified: ${JSON.stringify({ record: s.i, hash: s.hash, why, block: r?.blockNumber ?? null })}`)
    if (!r || !ev || ev.entry.id !== entryOf(s.i).id) {
      unverified(!r ? 'no receipt, from anvil or the archive' : !ev ? `a receipt without a PaymentRecorded event (${r.logs.length} logs)` : 'the event is of another record')
      continue
    }
    const e = ev.entry
    const digestOnChain = (): Promise<Hex> => call('digestOf', [e.id, e.parentTxHash, e.agentId, e.amount, e.protocol, e.origin, e.pathHash, e.depth, ev.timestamp])
    const onChain = await digestOnChain()
    const local = recordDigest(e, ev.timestamp)
    if (onChain === local) verified++
    else {
      // asked once more: a different answer the second time would be the call's, not the record's
      const again = await digestOnChain()
      unverified(`the contract answered ${String(onChain)} then ${String(again)}, not ${local} (timestamp ${ev.timestamp})`)
    }
  }
  return verified
}

/** The result line, first window against last; a lost record or an unverified sample fails the run. */
function report(run: WorkerRun, after: AfterRestart): void {
  const { windows, samples, acked } = run
  const { count, restartMs, minedAfterRestartMs, rssAfterRestart, verified } = after
  const first = windows[0]
  const last = windows[windows.length - 1]
  const ratio = (k: string): number => +(Number(last?.[k]) / Number(first?.[k])).toFixed(2)
  const maxHeld = Math.max(0, ...windows.flatMap((w) => w.snapshotsHeldMs as number[]))
  const maxHeldCpu = Math.max(0, ...windows.flatMap((w) => w.snapshotsAnvilCpuMs as number[]))
  const maxSend = Math.max(0, ...windows.map((w) => w.maxSendMs as number))
  const probes = windows.map((w) => w.probeSendMs as { p99: number; max: number })
  const rssAt = (n: number): unknown => windows.find((w) => w.n === n)?.rssMb
  const result = {
    recordsAcked: acked,
    recordsOnChainAfterKill: count,
    lost: Math.max(0, acked - count),
    anvilCpuMsPerRecordFirstLast: [first?.anvilCpuMsPerRecord, last?.anvilCpuMsPerRecord],
    anvilCpuRatioLastToFirst: ratio('anvilCpuMsPerRecord'),
    workerCpuMsPerRecordFirstLast: [first?.workerCpuMsPerRecord, last?.workerCpuMsPerRecord],
    workerCpuRatioLastToFirst: ratio('workerCpuMsPerRecord'),
    maxSnapshotHeldMs: maxHeld,
    maxSnapshotAnvilCpuMs: maxHeldCpu,
    maxSendMs: maxSend,
    probeSendMs: { worstP99: Math.max(0, ...probes.map((p) => p.p99)), max: Math.max(0, ...probes.map((p) => p.max)) },
    rssMbAt100k: rssAt(100_000),
    rssMbAtEnd: last?.rssMb,
    restartAfterSigkillMs: restartMs,
    allMinedAfterRestartMs: minedAfterRestartMs,
    rssAfterRestartMb: rssAfterRestart,
    samplesVerified: `${verified}/${samples.length}`,
  }
  console.log(JSON.stringify(result))
  if (result.lost > 0 || verified !== samples.length) process.exitCode = 1
}

const wi = process.argv.indexOf('--worker')
if (wi > 0) await worker(process.argv[wi + 1]!, arg('records', 1_000_000), arg('max-s', 1500))
else await driver(arg('records', Number(process.env.BENCH_DEVNET_RECORDS ?? 1_000_000)), arg('max-s', Number(process.env.BENCH_DEVNET_MAX_S ?? 1500)))
