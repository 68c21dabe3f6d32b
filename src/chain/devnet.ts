/**
 * Embedded dev chain: a real `anvil` (npm `@foundry-rs/anvil-linux-amd64` 1.7.1) child process
 * behind a journaling JSON-RPC front, so that acknowledged writes survive a SIGKILL of Paygate.
 *
 * Design
 * - anvil runs with `--no-mining`; this module mines. After a block of 0-2 txs the next tx is
 *   mined within ~10-50 ms; under load one block every `blockTimeMs` (250) holds all waiting txs.
 *   No empty blocks while idle. Chain time follows the wall clock; an `evm_increaseTime` offset
 *   survives restarts. A read that runs against the newest block's time (`eth_call`,
 *   `eth_estimateGas`, `eth_getBlockByNumber('latest')`, ... at latest/pending) first mines an
 *   empty block when the newest one is more than `freshBlockMs` behind chain time, so calls see
 *   the current time after an idle spell (one such block at a time; none while nothing asks).
 * - Every state-changing call (sends, evm_ and hardhat_/anvil_ setters, mines with their exact
 *   timestamps) is serialised and appended to `journal-<gen>.ndjson` with write(2) before the
 *   answer goes out, so a SIGKILL of Paygate loses nothing acknowledged (a power cut can: no
 *   fsync per call). Reads go straight through. A run of one sender's transactions sent
 *   together is one line, replayed pipelined as it was sent (1.4x faster than call by call).
 * - Snapshots: `anvil_dumpState` (state, blocks, receipts, logs) into `snap-<gen>/state.json`
 *   when the chain has been idle for 2 s with a tail worth replaying, when the estimated restart
 *   time (load the snapshot + replay the journal tail) passes `restartBudgetMs`, and on close().
 *   Pending txs are mined first; unmined ones (nonce gaps) are carried into the next journal.
 *   Start = `--load-state` of the newest complete snapshot + replay of the journals after it
 *   (same tx hashes, blocks, block hashes and timestamps).
 * - Talks to anvil over its IPC socket (88 us per call vs 286 us over HTTP). Serves HTTP
 *   JSON-RPC (batches too) on `host:port` for merchants, facilitators and wallets, and
 *   `request()` for viem `custom()` in process. `anvil_*` and `hardhat_*` dev methods work
 *   (setBalance, impersonation, evm_increaseTime, evm_mine, snapshots/revert); reset, dump/load
 *   and interval mining are refused (this module owns them).
 * - anvil never outlives Paygate: it runs under a `/bin/sh` watchdog reading a pipe from this
 *   process; when the pipe closes (close(), exit, crash, SIGKILL) the watchdog kills anvil by pid.
 *   close() also kills both by pid; a stale anvil recorded in `anvil.pid` is killed at start. The
 *   watchdog exits with anvil, so an anvil that dies is logged and every call fails at once with
 *   `DevnetUnavailableError`, as does a call anvil leaves unanswered for `ipcTimeoutMs`.
 *
 * Measured on the 2-core dev box (noisy, +-30%), ledger `record()` txs (~120k gas) signed with
 * locally managed nonces, 8 in flight; bench/devnet-soak.ts reproduces the anvil column.
 *
 * | | EDR 0.20 in-process (prototype) | anvil 1.7.1 child (this file) |
 * |---|---|---|
 * | start, empty chain | 120-280 ms | 45-70 ms |
 * | record tx/s fresh / after 20k | 875 / 973 (ratio 0.9) | 915-1310 / 479-672 (ratio 1.65-2.2: the window holds a ~1 s snapshot); 818 / 981 with snapshots off |
 * | sustained tx/s over 20k records | 1,240 | 660-1,040 (includes snapshot stalls) |
 * | one tx at a time, each waiting for its receipt | ~10/s (100 ms blocks) | 53-60/s fresh, 7-15/s after 20k |
 * | RSS after 20k (node + child) | 360 MB (600 MB after a replay) | 200-280 + 310-340 MB (up to 750 after restart) |
 * | restart holding 20k records | 10.0 s: replay is the only way back (EDR has no state dump; ~2,200 entries/s) | 0.65-0.72 s (load 123 MB state JSON); 1.8-2.8 s after a SIGKILL (tail replay; 3.8 s worst seen) |
 * | SIGKILL of the node process | 0 of 8,000 acked txs lost | 0 lost in 8 runs (3k-22k acked); anvil killed by the watchdog; same block hashes |
 * | stalls | none | a snapshot holds the chain ~55 ms per 1,000 records of history (1.0-1.1 s at 20k) |
 *
 * Why anvil: EDR is faster and flat, but holds everything in memory with no dump, so a restart
 * re-executes every tx (~0.5 ms each): 20k records = 10 s, twice the 5 s budget, and growing.
 * anvil reloads blocks, receipts and state from its own dump in 0.65 s at 20k. Its costs:
 * (1) a block costs ~3 ms to mine on a fresh chain and ~25 ms with 20k ledger records (anvil
 * rebuilds the state root), so send records without waiting for each receipt (or accept
 * 7-15 records/s for a strictly sequential writer at 20k); (2) snapshot stalls and state size
 * grow with history (~6 MB of JSON per 1,000 records): around 80k records a clean restart alone
 * passes ~3.5 s and snapshots stall ~4 s; prune or archive history before that.
 *
 * Packages: `@foundry-rs/anvil-linux-amd64@1.7.1` (the binary; no install script). The wrapper
 * `@foundry-rs/anvil` is not needed (its postinstall only fetches/checks the binary). Other
 * platforms: `@foundry-rs/anvil-{linux-arm64,darwin-arm64,darwin-amd64}@1.7.1` as
 * optionalDependencies, or `PAYGATE_ANVIL_PATH`. Linux/macOS only (`/bin/sh` watchdog).
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import * as fs from 'node:fs'
import * as http from 'node:http'
import { createRequire } from 'node:module'
import * as net from 'node:net'
import * as os from 'node:os'
import * as path from 'node:path'
import { promisify } from 'node:util'
import * as zlib from 'node:zlib'
import { lockFile } from './dir-lock.js'

const gunzip = promisify(zlib.gunzip)

/**
 * zlib's one-shot gunzip still runs chunk by chunk (16 KB by default), each chunk a main-thread
 * callback, then concatenates them: ~150 ms of main thread per 40 MB of state. gzip's trailer
 * holds the uncompressed size (mod 2^32, of the last member): sized to it, the output is one
 * chunk. A wrong hint only means more chunks; it is capped so a corrupt trailer cannot ask for
 * gigabytes.
 */
function gunzipChunkSize(gz: Buffer): number {
  const size = gz.length >= 18 ? gz.readUInt32LE(gz.length - 4) : 0
  return Math.min(2 ** 30, Math.max(64 * 1024, size + 1))
}

export interface DevnetOptions {
  dataDir: string
  chainId: number
  host: string
  port: number
  /**
   * Spacing (ms) of blocks under load; default 250. After a block of at most 2 txs the next one
   * comes after max(10 ms, 2x the last mining time), so a caller that waits for each receipt is
   * not held 200 ms per tx.
   */
  blockTimeMs?: number
  /** `level`: what went wrong is `warn` (the chain carries on) or `error` (it cannot); else information. */
  log?: (msg: string, fields?: object, level?: 'warn' | 'error') => void
  /** Path of the anvil binary (default: config chain.anvilPath, else the npm package). */
  anvilPath?: string
  /**
   * Snapshot when loading the last snapshot plus replaying the journal tail would take longer
   * than this (ms, estimated from the snapshot size and the tail's measured cost). Default 3500.
   */
  restartBudgetMs?: number
  /** Snapshot after this much idle time when the tail is worth replaying (ms). Default 2000. */
  idleSnapshotMs?: number
  /**
   * A read at the newest block's time mines an empty block first when that block is older than
   * this (ms of chain time). Default 2000.
   */
  freshBlockMs?: number
  /** An IPC call anvil has not answered within this (ms) fails; a state dump gets 4x. Default 30000. */
  ipcTimeoutMs?: number
}

/**
 * The embedded chain cannot answer: anvil exited, its IPC connection closed, or it left a call
 * unanswered past the timeout.
 */
export class DevnetUnavailableError extends Error {
  override readonly name = 'DevnetUnavailableError'
  /** EIP-1193 "disconnected": viem maps it to ProviderDisconnectedError, which it does not retry. */
  readonly code = 4900
  constructor(
    message: string,
    /** Anvil left the call unanswered past its deadline (it may still run it). */
    readonly timedOut = false,
  ) {
    super(message)
  }
}

export interface DevnetStats {
  blocks: number
  generation: number
  tailEntries: number
  replayed: number
  replayMs: number
  loadMs: number
  /** moving average of the time one block takes to mine */
  mineMs: number
  /** how long each of the last snapshots held the chain */
  snapshotMs: number[]
}

export interface Devnet {
  rpcUrl: string
  chainId: number
  /** PID of the anvil process (the watchdog shell is its parent). */
  childPid: number
  request(args: { method: string; params?: unknown[] | object }): Promise<unknown>
  /**
   * `eth_sendRawTransaction` for several raw transactions of ONE sender (consecutive nonces),
   * in one round trip to anvil and one journal line. anvil may take them in any order: its pool
   * orders one sender's transactions by nonce, so the mined blocks come out the same, and so do
   * they when a journal replay sends the line again the same way. Per transaction: its hash or
   * the error.
   */
  sendRawTransactions(raws: string[]): Promise<SendResult[]>
  stats(): DevnetStats
  close(): Promise<void>
}

/** anvil's default dev accounts: 10 accounts of 10,000 ETH derived from this mnemonic. */
export const DEVNET_MNEMONIC = 'test test test test test test test test test test test junk'

type RpcRequest = { jsonrpc?: string; id?: unknown; method?: unknown; params?: unknown }
type RpcError = { code: number; message: string; data?: unknown }
type RpcResponse = { jsonrpc: '2.0'; id: unknown; result?: unknown; error?: RpcError }
export type SendResult = { hash: string } | { error: RpcError }

const READ_ONLY = new Set([
  'eth_chainId',
  'eth_blockNumber',
  'eth_call',
  'eth_estimateGas',
  'eth_gasPrice',
  'eth_maxPriorityFeePerGas',
  'eth_feeHistory',
  'eth_blobBaseFee',
  'eth_accounts',
  'eth_syncing',
  'eth_mining',
  'eth_hashrate',
  'eth_coinbase',
  'eth_protocolVersion',
  'eth_sign',
  'eth_signTypedData',
  'eth_signTypedData_v4',
  'personal_sign',
  'eth_signTransaction',
  'eth_newFilter',
  'eth_newBlockFilter',
  'eth_newPendingTransactionFilter',
  'eth_uninstallFilter',
  'eth_createAccessList',
  'eth_pendingTransactions',
  'eth_simulateV1',
  'eth_fillTransaction',
  'anvil_nodeInfo',
  'anvil_metadata',
  'hardhat_metadata',
  'anvil_getGenesisTime',
  'anvil_getIntervalMining',
])
const READ_PREFIXES = ['eth_get', 'debug_', 'trace_', 'ots_', 'txpool_', 'net_', 'web3_', 'erigon_']
const SENDS = new Set(['eth_sendRawTransaction', 'eth_sendTransaction'])
const MINES = new Set(['evm_mine', 'anvil_mine', 'hardhat_mine'])
const REFUSED = new Set([
  'anvil_reset',
  'hardhat_reset',
  'anvil_dumpState',
  'hardhat_dumpState',
  'anvil_loadState',
  'hardhat_loadState',
  'evm_setIntervalMining',
  'anvil_setIntervalMining',
  'anvil_setChainId',
  'anvil_setRpcUrl',
  'anvil_rollback',
  'anvil_reorg',
])
const AUTOMINE_QUERIES = new Set(['hardhat_getAutomine', 'anvil_getAutomine'])
const AUTOMINE_SETTERS = new Set(['evm_setAutomine', 'anvil_setAutomine'])
/** Reads that run against the newest block's time, each with the index of its block tag. */
const TIMED_READS = new Map<string, number>([
  ['eth_call', 1],
  ['eth_estimateGas', 1],
  ['eth_createAccessList', 1],
  ['eth_simulateV1', 1],
  ['eth_fillTransaction', 1],
  ['debug_traceCall', 1],
  ['eth_getBlockByNumber', 0],
])
/** Whether this read sees the newest block: a tag of latest or pending, or none where that means latest. */
function readsNewestBlock(method: string, params: unknown[]): boolean {
  const at = TIMED_READS.get(method)
  if (at === undefined) return false
  const tag = params[at]
  return tag === 'latest' || tag === 'pending' || ((tag === undefined || tag === null) && method !== 'eth_getBlockByNumber')
}

const MIN_BLOCK_GAP_MS = 10
/** data dirs open in this process */
const openDirs = new Set<string>()
const isReadOnly = (m: string): boolean => READ_ONLY.has(m) || READ_PREFIXES.some((p) => m.startsWith(p))
const rpcError = (id: unknown, code: number, message: string): RpcResponse => ({ jsonrpc: '2.0', id, error: { code, message } })
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

function anvilBinary(explicit?: string): string {
  if (explicit) return explicit
  const arch = process.arch === 'x64' ? 'amd64' : process.arch
  const pkg = `@foundry-rs/anvil-${process.platform}-${arch}`
  const require = createRequire(import.meta.url)
  let dir: string
  try {
    dir = path.dirname(require.resolve(`${pkg}/package.json`))
  } catch {
    throw new Error(`embedded chain: npm package ${pkg} is not installed (set chain.anvilPath, PAYGATE_CHAIN_ANVIL_PATH, or configure chain.rpcUrl)`)
  }
  const bin = path.join(dir, 'bin', process.platform === 'win32' ? 'anvil.exe' : 'anvil')
  try {
    fs.accessSync(bin, fs.constants.X_OK)
  } catch {
    fs.chmodSync(bin, 0o755)
  }
  return bin
}

type Waiter = { resolve: (r: RpcResponse) => void; reject: (e: Error) => void; method: string; ms: number; deadline: number }

/**
 * Newline-delimited JSON-RPC over anvil's IPC socket; answers may come out of order. A call
 * unanswered past its deadline fails (checked by one sweep timer, not a timer per call: the paid
 * path makes thousands of calls a second).
 */
class IpcClient {
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

interface Child {
  proc: ChildProcess
  anvilPid: number
  ipc: IpcClient
  ipcPath: string
  stderrTail: () => string
}

async function spawnAnvil(bin: string, args: string[], dir: string, pidFile: string, ipcTimeoutMs: number, log: NonNullable<DevnetOptions['log']>): Promise<Child> {
  // in the data dir (a socket left by a killed anvil is replaced next time), unless the path is
  // too long for a unix socket
  let ipcPath = path.join(dir, 'anvil.ipc')
  if (Buffer.byteLength(ipcPath) > 100) ipcPath = path.join(os.tmpdir(), `paygate-anvil-${process.pid}-${randomBytes(4).toString('hex')}.ipc`)
  fs.rmSync(ipcPath, { force: true })
  // The shell keeps our pipe on fd 3; a subshell reading it kills anvil on EOF (we closed it,
  // exited or were SIGKILLed). The shell itself waits for anvil and exits with its status, so
  // an anvil that dies is seen here as the watchdog's exit (128+n: killed by signal n).
  const script = 'exec 3<&0; "$0" "$@" </dev/null & p=$!; echo "pid $p"; (read -r _ <&3; kill $p 2>/dev/null) & r=$!; wait $p; s=$?; kill $r 2>/dev/null; exit $s'
  // Own process group: a terminal's Ctrl-C (or `timeout`) signals Paygate, which snapshots and
  // then stops anvil itself, instead of killing anvil first.
  const proc = spawn('/bin/sh', ['-c', script, bin, ...args, '--ipc', ipcPath], { stdio: ['pipe', 'pipe', 'pipe'], detached: true })
  proc.stdin!.on('error', () => {})
  let stderr = ''
  proc.stderr!.setEncoding('utf8')
  proc.stderr!.on('data', (d: string) => {
    stderr = (stderr + d).slice(-4000)
  })
  let exited = false
  proc.once('exit', () => {
    exited = true
  })
  const anvilPid = await new Promise<number>((resolve, reject) => {
    let out = ''
    const t = setTimeout(() => reject(new Error('embedded chain: anvil watchdog did not start')), 5000)
    proc.stdout!.setEncoding('utf8')
    proc.stdout!.on('data', (d: string) => {
      out += d
      const m = /pid (\d+)/.exec(out)
      if (m) {
        clearTimeout(t)
        resolve(Number(m[1]))
      }
    })
    proc.once('error', (e) => {
      clearTimeout(t)
      reject(e)
    })
  })
  proc.stdout!.resume()
  fs.writeFileSync(pidFile, String(anvilPid))
  // wait for the IPC socket: loading a large state takes a while
  const deadline = Date.now() + 60_000
  for (;;) {
    if (exited || !pidAlive(anvilPid)) throw new Error(`embedded chain: anvil exited at start: ${stderr.trim().slice(-1000)}`)
    if (fs.existsSync(ipcPath)) {
      let ipc: IpcClient | undefined
      try {
        ipc = await IpcClient.connect(ipcPath, ipcTimeoutMs)
        const r = await ipc.call('eth_chainId', '[]')
        if (!r.error) {
          log('anvil started', { pid: anvilPid, ipcPath })
          return { proc, anvilPid, ipc, ipcPath, stderrTail: () => stderr }
        }
      } catch {
        // not listening yet
      }
      ipc?.close()
    }
    if (Date.now() > deadline) {
      try {
        process.kill(anvilPid, 'SIGKILL')
      } catch {}
      throw new Error('embedded chain: anvil did not open its IPC socket within 60 s')
    }
    await sleep(10)
  }
}

async function stopAnvil(child: Child): Promise<void> {
  child.ipc.close()
  // Once the watchdog has exited it has reaped anvil (it exits after `wait`), and been reaped:
  // their pids may belong to other processes by now (anvil may have died long before).
  const watchdogGone = (): boolean => child.proc.exitCode !== null || child.proc.signalCode !== null
  const exited = new Promise<void>((r) => {
    if (watchdogGone()) r()
    else child.proc.once('exit', () => r())
  })
  child.proc.stdin!.end() // the watchdog kills anvil and exits
  if (!watchdogGone()) {
    try {
      process.kill(child.anvilPid, 'SIGTERM')
    } catch {}
  }
  await Promise.race([exited, sleep(3000)])
  // a stuck watchdog, or one killed by a signal (then anvil may be left without it)
  const left = !watchdogGone() ? [child.anvilPid, child.proc.pid ?? 0] : child.proc.signalCode !== null ? [child.anvilPid] : []
  for (const pid of left) {
    if (pid && pidAlive(pid)) {
      try {
        process.kill(pid, 'SIGKILL')
      } catch {}
    }
  }
  try {
    fs.unlinkSync(child.ipcPath)
  } catch {}
}

interface ChainMeta {
  format: 1
  engine: 'anvil'
  chainId: number
  genesisTime: number
  hardfork: string
}

interface SnapshotMeta {
  /** chain-time offset (s) relative to the wall clock when the snapshot was taken */
  offset: number
  blocks: number
  at: string
}

export async function startDevnet(opts: DevnetOptions): Promise<Devnet> {
  const log = opts.log ?? ((): void => {})
  const blockTimeMs = opts.blockTimeMs ?? 250
  const restartBudgetMs = opts.restartBudgetMs ?? 3500
  const idleSnapshotMs = opts.idleSnapshotMs ?? 2000
  const freshBlockMs = opts.freshBlockMs ?? 2000
  const ipcTimeoutMs = opts.ipcTimeoutMs ?? 30_000
  const dir = path.resolve(opts.dataDir)
  fs.mkdirSync(dir, { recursive: true })

  // one owner per data dir: an OS file lock, released by the kernel when its holder dies
  if (openDirs.has(dir)) throw new Error(`embedded chain: ${dir} is already open in this process`)
  const lock = lockFile(path.join(dir, 'devnet.lock'), `embedded chain: ${dir}`)
  openDirs.add(dir)
  const unlock = (): void => {
    openDirs.delete(dir)
    lock.release()
  }
  if (!lock.kernel) log('flock(1) not found: the data dir lock falls back to a pid check', {}, 'warn')

  const metaFile = path.join(dir, 'chain.json')
  let meta: ChainMeta
  if (fs.existsSync(metaFile)) {
    meta = JSON.parse(fs.readFileSync(metaFile, 'utf8')) as ChainMeta
    if (meta.chainId !== opts.chainId) {
      unlock()
      throw new Error(`embedded chain: ${dir} holds chain id ${meta.chainId}, not ${opts.chainId} (use another data dir or the old chain id)`)
    }
  } else {
    meta = { format: 1, engine: 'anvil', chainId: opts.chainId, genesisTime: Math.floor(Date.now() / 1000), hardfork: 'prague' }
    fs.writeFileSync(`${metaFile}.tmp`, JSON.stringify(meta))
    fs.renameSync(`${metaFile}.tmp`, metaFile)
  }

  // a stale anvil from a crashed run (its watchdog should have killed it)
  const pidFile = path.join(dir, 'anvil.pid')
  try {
    const old = Number(fs.readFileSync(pidFile, 'utf8'))
    if (old > 0 && pidAlive(old) && fs.readFileSync(`/proc/${old}/cmdline`, 'utf8').includes('anvil')) {
      log('killing stale anvil', { pid: old }, 'warn')
      process.kill(old, 'SIGKILL')
    }
  } catch {}

  // Generations: snap-<g>/ holds the chain as it was when journal-<g> was started. Start from the
  // newest complete snapshot and replay every journal from its generation on (a snapshot whose
  // files were still being written when we died leaves its journal behind: replay it too).
  const journalPath = (g: number): string => path.join(dir, `journal-${g}.ndjson`)
  const numbered = (re: RegExp): number[] =>
    fs
      .readdirSync(dir)
      .map((f) => re.exec(f))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => Number(m[1]))
  const base =
    numbered(/^snap-(\d+)$/)
      .filter((g) => fs.existsSync(path.join(dir, `snap-${g}`, 'meta.json')))
      .sort((a, b) => b - a)[0] ?? 0
  const journals = numbered(/^journal-(\d+)\.ndjson$/)
    .filter((g) => g >= base)
    .sort((a, b) => a - b)
  for (const f of fs.readdirSync(dir)) {
    const m = /^(snap|journal)-(\d+)(\.tmp|\.ndjson)?$/.exec(f)
    if (!m) continue
    const g = Number(m[2])
    if (m[3] === '.tmp' || (m[1] === 'snap' && g !== base) || (m[1] === 'journal' && g < base)) fs.rmSync(path.join(dir, f), { recursive: true, force: true })
  }
  let gen = Math.max(base, ...journals)
  let offset = 0 // desired chain-time offset (s) relative to the wall clock
  let loadState: string | undefined
  let stateMb = 0 // size of the newest snapshot: loading it takes ~6 ms per MB
  if (base > 0) {
    loadState = path.join(dir, `snap-${base}`, 'state.json')
    stateMb = fs.statSync(loadState).size / 2 ** 20
    offset = (JSON.parse(fs.readFileSync(path.join(dir, `snap-${base}`, 'meta.json'), 'utf8')) as SnapshotMeta).offset
  }

  const args = [
    '--silent',
    '--host',
    '127.0.0.1',
    '--port',
    '0',
    '--no-mining',
    '--order',
    'fifo',
    '--chain-id',
    String(opts.chainId),
    '--timestamp',
    String(meta.genesisTime),
    '--hardfork',
    meta.hardfork,
    '--gas-limit',
    '100000000',
    '--prune-history',
    '32',
  ]
  if (loadState) args.push('--load-state', loadState)
  const tLoad = performance.now()
  let child: Child
  try {
    child = await spawnAnvil(anvilBinary(opts.anvilPath), args, dir, pidFile, ipcTimeoutMs, log)
  } catch (e) {
    unlock()
    throw e
  }
  const loadMs = performance.now() - tLoad

  let closed = false
  const raw = async (method: string, params: unknown[] = [], ms?: number): Promise<unknown> => {
    const r = await child.ipc.call(method, JSON.stringify(params), ms)
    if (r.error) throw Object.assign(new Error(`${method}: ${r.error.message}`), { code: r.error.code })
    return r.result
  }

  try {
    /** hash -> the journal line that sent it, for txs acknowledged but not yet mined */
    const pending = new Map<string, string>()
    /** Forget pending txs that are mined (or gone), asking the node for each. */
    const dropMined = async (): Promise<void> => {
      for (const h of [...pending.keys()]) {
        const tx = (await raw('eth_getTransactionByHash', [h])) as { blockNumber?: string | null } | null
        if (!tx || tx.blockNumber) pending.delete(h)
      }
    }
    let latestTs = 0 // the newest block's timestamp (s)
    /** The newest block; what it mined is no longer pending. */
    const latestMined = async (): Promise<{ number: string; timestamp: string; transactions: string[] }> => {
      const b = (await raw('eth_getBlockByNumber', ['latest', false])) as { number: string; timestamp: string; transactions: string[] }
      for (const h of b.transactions) pending.delete(h.toLowerCase())
      latestTs = Number(b.timestamp)
      return b
    }
    /** A journal line, from params already in JSON (as sent to anvil: each raw tx is encoded once). */
    const journalLine = (method: string, paramsJson: string): string => `{"m":${JSON.stringify(method)},"p":${paramsJson}}`
    /** One line for a run of calls of one method (see sendRawTransactions), replayed pipelined. */
    const journalRun = (method: string, paramsJson: string[]): string => `{"m":${JSON.stringify(method)},"ps":[${paramsJson.join(',')}]}`
    const journalCall = (method: string, params: unknown[]): string => journalLine(method, JSON.stringify(params))
    let blocks = 0
    let tailEntries = 0
    let freshTail = 0 // of tailEntries, the empty blocks mined only to bring chain time up to date
    let nextBlockTimeSet = false // the caller set the next block's timestamp: no block for chain time may take it
    const SET_NEXT_TIME = /^(evm|anvil|hardhat)_setNextBlockTimestamp$/
    let tailCostMs = 0 // estimated time to replay the current journal tail
    const snapshotMs: number[] = []

    // ---- replay the journals ----
    const tReplay = performance.now()
    let replayed = 0
    let failures = 0
    for (const g of journals) {
      let text = fs.readFileSync(journalPath(g), 'utf8')
      const end = text.lastIndexOf('\n') + 1
      if (end !== text.length) {
        log('dropping a torn journal tail', { journal: g, bytes: text.length - end }, 'warn')
        fs.truncateSync(journalPath(g), Buffer.byteLength(text.slice(0, end)))
        text = text.slice(0, end)
      }
      let pos = 0
      while (pos < text.length) {
        const nl = text.indexOf('\n', pos)
        const line = text.slice(pos, nl)
        pos = nl + 1
        const entry = JSON.parse(line) as { o?: number; m?: string; p?: unknown[]; ps?: unknown[][]; f?: 1 }
        if (entry.o !== undefined) {
          tailEntries++
          offset = entry.o
          continue
        }
        // A batch line (one sender's run, see sendRawTransactions) goes back to anvil the way it
        // came: pipelined, in one write. The rest, one call at a time, in journal order.
        if (SET_NEXT_TIME.test(entry.m!)) nextBlockTimeSet = true
        else if (MINES.has(entry.m!)) nextBlockTimeSet = false
        const calls = (entry.ps ?? [entry.p ?? []]).map((c) => JSON.stringify(c))
        const t = performance.now()
        const rs = entry.ps ? await child.ipc.callMany(entry.m!, calls) : [await child.ipc.call(entry.m!, calls[0]!)]
        tailCostMs += performance.now() - t
        tailEntries += calls.length
        if (entry.f) freshTail++
        replayed += calls.length
        rs.forEach((r, i) => {
          if (r.error) {
            // e.g. a carried-over pending tx that the previous journal already sent
            if (++failures <= 5) log('journal replay: call failed', { method: entry.m, error: r.error.message }, 'warn')
          } else if (SENDS.has(entry.m!) && typeof r.result === 'string') pending.set(r.result.toLowerCase(), entry.ps ? journalLine(entry.m!, calls[i]!) : line)
        })
        // What a block mined is no longer pending: one read per block here saves asking after
        // every replayed tx below (that took longer than the replay itself).
        if (entry.m === 'evm_mine' && !rs[0]!.error) await latestMined()
      }
    }
    if (failures) log('journal replay finished with failures', { failures }, 'warn')
    await dropMined()
    const replayMs = performance.now() - tReplay

    // chain-time: explicit-timestamp mines during replay moved anvil's offset; put it back
    {
      const cur = Number(await raw('evm_increaseTime', [0]))
      if (offset > cur) await raw('evm_increaseTime', [offset - cur])
      else if (offset < cur) await raw('anvil_setTime', [Math.floor(Date.now() / 1000) + offset]).catch(() => {})
    }
    blocks = Number((await latestMined()).number)

    let fd = fs.openSync(journalPath(gen), 'a')
    /** A journal line for `entries` calls. */
    const append = (line: string, entries = 1): void => {
      fs.writeSync(fd, `${line}\n`)
      tailEntries += entries
    }

    let dead: DevnetUnavailableError | null = null // anvil exited or stalled under us
    // ---- serial queue for everything that changes chain state ----
    let tail: Promise<unknown> = Promise.resolve()
    const serial = <T>(fn: () => Promise<T>): Promise<T> => {
      const p = tail.then(fn, fn).catch((e: unknown) => {
        // A state change anvil left unanswered may still run when anvil wakes, unjournalled: the
        // chain and its journal could differ from then on, so nothing more is sent to it.
        if (e instanceof DevnetUnavailableError && e.timedOut && !dead) {
          dead = new DevnetUnavailableError(`embedded chain: anvil stalled on a state change (${e.message}); restart Paygate`)
          log('anvil stalled on a state change; the embedded chain refuses every call until Paygate restarts', { error: e.message }, 'error')
          child.ipc.fail(dead, true)
        }
        throw e
      })
      tail = p.catch(() => {})
      return p
    }

    const recordOffset = async (): Promise<void> => {
      const cur = Number(await raw('evm_increaseTime', [0]))
      if (cur !== offset) {
        offset = cur
        append(JSON.stringify({ o: offset }))
      }
    }

    let minedWaiters: Array<() => void> = []
    const afterMine = async (): Promise<{ timestamp: number; txs: number }> => {
      const b = await latestMined()
      const n = Number(b.number)
      // several blocks (anvil_mine): the earlier blocks' txs are found by asking
      if (n - blocks > 1) await dropMined()
      blocks = n
      nextBlockTimeSet = false
      const w = minedWaiters
      minedWaiters = []
      for (const f of w) f()
      return { timestamp: Number(b.timestamp), txs: b.transactions.length }
    }

    // ---- snapshots ----
    const tailBudgetMs = (): number => Math.max(1000, restartBudgetMs - 6 * stateMb)
    // The chain is held only while anvil dumps; unpacking and writing the files happens after,
    // while new calls already go to the next journal.
    let commits: Promise<void> = Promise.resolve()
    const commit = async (g: number, state: string, sm: SnapshotMeta): Promise<void> => {
      const tmp = path.join(dir, `snap-${g}.tmp`)
      fs.rmSync(tmp, { recursive: true, force: true })
      fs.mkdirSync(tmp)
      // One-shot gunzip and write run in the libuv threadpool; a stream pipeline costs main-thread
      // callbacks per chunk, which competes with the paid path under load.
      const gz = Buffer.from(state.slice(2), 'hex')
      const json = await gunzip(gz, { chunkSize: gunzipChunkSize(gz) })
      await fs.promises.writeFile(path.join(tmp, 'state.json'), json)
      fs.writeFileSync(path.join(tmp, 'meta.json'), JSON.stringify(sm))
      fs.renameSync(tmp, path.join(dir, `snap-${g}`)) // commit point
      stateMb = json.length / 2 ** 20
      for (const f of fs.readdirSync(dir)) {
        const m = /^(snap|journal)-(\d+)(\.ndjson)?$/.exec(f)
        if (m && Number(m[2]) < g) fs.rmSync(path.join(dir, f), { recursive: true, force: true })
      }
    }
    const snapshot = async (): Promise<void> => {
      const t = performance.now()
      if (pending.size) await mineLocked() // the dump holds no mempool
      await dropMined()
      const state = (await raw('anvil_dumpState', [], 4 * ipcTimeoutMs)) as string
      const next = gen + 1
      // the next journal starts with the txs still waiting in the mempool (e.g. nonce gaps)
      fs.writeFileSync(journalPath(next), [...pending.values()].map((l) => `${l}\n`).join(''))
      fs.closeSync(fd)
      fd = fs.openSync(journalPath(next), 'a')
      gen = next
      tailEntries = pending.size
      freshTail = 0
      tailCostMs = 0
      const sm: SnapshotMeta = { offset, blocks, at: new Date().toISOString() }
      const ms = Math.round(performance.now() - t)
      snapshotMs.push(ms)
      if (snapshotMs.length > 50) snapshotMs.shift()
      const tc = performance.now()
      commits = commits
        .then(() => commit(next, state, sm))
        .then(
          () => log('chain snapshot', { generation: next, blocks: sm.blocks, heldMs: ms, writeMs: Math.round(performance.now() - tc) }),
          (e: unknown) => log('writing a chain snapshot failed (the journals still hold everything)', { generation: next, error: String(e) }, 'warn'),
        )
    }

    // ---- mining ----
    let automine = true
    let mineTimer: NodeJS.Timeout | undefined
    let lastMineAt = 0
    let lastWriteAt = Date.now() // last state-changing request received
    let snapshotQueued = false
    let mineMs = 3 // moving average of an evm_mine
    let lastBlockTxs = 0
    /** `fresh`: mined only to bring chain time up to date (marked so, a tail of them alone is not worth a snapshot at close). */
    const mineLocked = async (fresh = false): Promise<number> => {
      const t = performance.now()
      await raw('evm_mine')
      const b = await afterMine()
      if (fresh) {
        append(`{"m":"evm_mine","p":[${b.timestamp}],"f":1}`)
        freshTail++
      } else append(journalCall('evm_mine', [b.timestamp]))
      const dt = performance.now() - t
      mineMs = 0.7 * mineMs + 0.3 * dt
      tailCostMs += dt
      lastMineAt = Date.now()
      lastBlockTxs = b.txs
      return b.txs
    }
    // After a block of 0-2 txs (a caller waiting for each receipt, or an idle chain) the next tx
    // is mined after a short gap; after a bigger block (load) blocks come every blockTimeMs and
    // hold all waiting txs: a block costs ~3 ms on a fresh chain but ~25-50 ms with 20k ledger
    // records (anvil rebuilds the state root), so under load fewer, bigger blocks win.
    const scheduleMine = (): void => {
      if (mineTimer || !automine || closed || dead) return
      const gap = lastBlockTxs <= 2 ? Math.min(blockTimeMs, Math.max(MIN_BLOCK_GAP_MS, 2 * mineMs)) : blockTimeMs
      mineTimer = setTimeout(
        () => {
          mineTimer = undefined
          serial(async () => {
            if (closed || dead || !pending.size) return 0 // (a fresh block may have taken them)
            const n = await mineLocked()
            if (tailCostMs > tailBudgetMs()) await snapshot()
            return n
          }).then(
            (n) => {
              if (n > 0 && pending.size > 0) scheduleMine()
            },
            (e: unknown) => log('mining failed', { error: String(e) }, 'warn'),
          )
        },
        Math.max(0, lastMineAt + gap - Date.now()),
      )
    }
    if (pending.size) scheduleMine()

    const idleTimer = setInterval(() => {
      if (closed || snapshotQueued || Date.now() - lastWriteAt < idleSnapshotMs) return
      // worth it when replaying the tail would cost at least half what the last snapshot cost
      if (tailCostMs < Math.max(100, (snapshotMs[snapshotMs.length - 1] ?? 0) / 2)) return
      snapshotQueued = true
      serial(async () => {
        if (Date.now() - lastWriteAt >= idleSnapshotMs) await snapshot()
      })
        .catch((e: unknown) => log('snapshot failed', { error: String(e) }, 'warn'))
        .finally(() => {
          snapshotQueued = false
        })
    }, 500)
    idleTimer.unref()

    // ---- chain time for reads ----
    // anvil runs a call against the newest block, whose timestamp stops while nothing is mined:
    // after 10 idle minutes an EIP-3009 authorization signed with validAfter = now - 600 is "not
    // yet valid" to every simulation. So such a read first mines an empty block when the newest
    // one is stale. Checked from memory (free under load, when blocks are fresh); concurrent
    // reads share one block; none is mined while nothing asks.
    let freshening: Promise<void> | null = null
    let lastFreshAt = 0
    const stale = (): boolean => Date.now() + offset * 1000 - latestTs * 1000 > freshBlockMs
    const freshen = (): Promise<void> =>
      (freshening ??= serial(async () => {
        if (closed || dead || nextBlockTimeSet || !stale()) return // a block came while this waited
        lastFreshAt = Date.now()
        await mineLocked(true)
        // still behind: the offset we hold is not anvil's (e.g. a block at a set timestamp moved it)
        if (stale()) await recordOffset()
      })
        .catch((e: unknown) => log('mining a block for chain time failed', { error: String(e) }, 'warn'))
        .finally(() => {
          freshening = null
        }))

    // ---- request handling ----
    const handle = async (req: RpcRequest): Promise<RpcResponse> => {
      const id = req?.id ?? null
      if (!req || typeof req.method !== 'string') return rpcError(id, -32600, 'invalid request')
      const method = req.method
      const params: unknown[] = Array.isArray(req.params) ? req.params : req.params === undefined || req.params === null ? [] : [req.params]
      const reply = (r: RpcResponse): RpcResponse => (r.error ? { jsonrpc: '2.0', id, error: r.error } : { jsonrpc: '2.0', id, result: r.result ?? null })
      if (closed) return rpcError(id, -32000, 'embedded chain is closed')
      if (dead) throw dead
      if (REFUSED.has(method)) return rpcError(id, -32601, `${method} is not available on the Paygate embedded chain`)
      if (AUTOMINE_QUERIES.has(method)) return { jsonrpc: '2.0', id, result: automine }
      if (AUTOMINE_SETTERS.has(method)) {
        automine = params[0] === true
        if (automine && pending.size) scheduleMine()
        return { jsonrpc: '2.0', id, result: null }
      }
      if (method === 'eth_getTransactionReceipt') {
        // a tx we are about to mine: wait for its block instead of answering null
        const h = typeof params[0] === 'string' ? params[0].toLowerCase() : ''
        const until = Date.now() + 2 * blockTimeMs + 1000
        while (pending.has(h) && automine && !closed && !dead && Date.now() < until) {
          await new Promise<void>((r) => {
            minedWaiters.push(r)
            setTimeout(r, Math.max(1, until - Date.now()))
          })
        }
      }
      if (isReadOnly(method)) {
        // (with automine off the caller mines: a block here would take its pending txs)
        if (automine && !nextBlockTimeSet && readsNewestBlock(method, params) && stale() && Date.now() - lastFreshAt >= freshBlockMs) await freshen()
        return reply(await child.ipc.call(method, JSON.stringify(params)))
      }
      lastWriteAt = Date.now()
      return serial(async () => {
        if (closed) return rpcError(id, -32000, 'embedded chain is closed')
        const t = performance.now()
        const r = await child.ipc.call(method, JSON.stringify(params))
        if (r.error) return reply(r)
        if (MINES.has(method)) {
          const before = blocks
          const b = await afterMine()
          if (method === 'evm_mine') append(journalCall('evm_mine', [b.timestamp]))
          else {
            const first = (await raw('eth_getBlockByNumber', [`0x${(before + 1).toString(16)}`, false])) as { timestamp: string }
            append(journalCall('evm_setNextBlockTimestamp', [Number(first.timestamp)]))
            append(journalCall(method, params))
          }
          await recordOffset()
          lastMineAt = Date.now()
        } else {
          const line = journalCall(method, params)
          append(line)
          if (SENDS.has(method) && typeof r.result === 'string') {
            pending.set(r.result.toLowerCase(), line)
            scheduleMine()
          } else if (/time|revert/i.test(method)) {
            if (SET_NEXT_TIME.test(method)) nextBlockTimeSet = true
            await recordOffset()
            // a revert goes back to an older block
            if (/revert/i.test(method)) latestTs = Number(((await raw('eth_getBlockByNumber', ['latest', false])) as { timestamp: string }).timestamp)
          }
        }
        tailCostMs += performance.now() - t
        if (tailCostMs > tailBudgetMs() * 1.5) await snapshot() // sustained writes without mining (automine off)
        return reply(r)
      })
    }

    const sendRawTransactions = (raws: string[]): Promise<SendResult[]> => {
      if (!raws.length) return Promise.resolve([])
      lastWriteAt = Date.now()
      return serial(async () => {
        if (closed) throw new Error('embedded chain is closed')
        if (dead) throw dead
        const t = performance.now()
        const params = raws.map((r) => JSON.stringify([r]))
        const rs = await child.ipc.callMany('eth_sendRawTransaction', params)
        const sent: string[] = []
        const out = rs.map((r, i): SendResult => {
          if (r.error || typeof r.result !== 'string') return { error: r.error ?? { code: -32603, message: 'no transaction hash' } }
          sent.push(params[i]!)
          // a tx carried into the next journal at a snapshot goes there as a line of its own
          pending.set(r.result.toLowerCase(), journalLine('eth_sendRawTransaction', params[i]!))
          return { hash: r.result }
        })
        if (sent.length) {
          // one line for the run, so a replay can pipeline it too (the accepted ones, in order)
          append(journalRun('eth_sendRawTransaction', sent), sent.length)
          scheduleMine()
        }
        tailCostMs += performance.now() - t
        if (tailCostMs > tailBudgetMs() * 1.5) await snapshot()
        return out
      })
    }

    const request = async (a: { method: string; params?: unknown[] | object }): Promise<unknown> => {
      const r = await handle({ jsonrpc: '2.0', id: 1, method: a.method, params: a.params })
      if (r.error) throw Object.assign(new Error(r.error.message), { code: r.error.code, data: r.error.data })
      return r.result
    }

    const server = http.createServer((req, res) => {
      if (req.method !== 'POST') {
        res.writeHead(req.method === 'OPTIONS' ? 204 : 405, { allow: 'POST' }).end()
        return
      }
      const chunks: Buffer[] = []
      let size = 0
      req.on('data', (c: Buffer) => {
        size += c.length
        if (size > 32 << 20) {
          res.writeHead(413).end()
          req.destroy()
        } else chunks.push(c)
      })
      req.on('end', () => {
        let body: unknown
        try {
          body = JSON.parse(Buffer.concat(chunks).toString('utf8'))
        } catch {
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(rpcError(null, -32700, 'parse error')))
          return
        }
        const one = (x: unknown): Promise<RpcResponse> => handle(x as RpcRequest).catch((e: unknown) => rpcError((x as RpcRequest)?.id ?? null, -32603, (e as Error).message))
        const out: Promise<unknown> = Array.isArray(body) ? (body.length ? Promise.all(body.map(one)) : Promise.resolve(rpcError(null, -32600, 'empty batch'))) : one(body)
        void out.then((v) => {
          if (!res.destroyed) res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(v))
        })
      })
    })
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject)
      server.listen(opts.port, opts.host, () => {
        server.removeListener('error', reject)
        resolve()
      })
    })
    const port = (server.address() as net.AddressInfo).port
    const rpcUrl = `http://${opts.host.includes(':') ? `[${opts.host}]` : opts.host}:${port}`
    log('embedded chain ready', { rpcUrl, chainId: opts.chainId, anvilPid: child.anvilPid, generation: gen, blocks, replayed, loadMs: Math.round(loadMs), replayMs: Math.round(replayMs) })

    // If anvil dies under us, say so loudly, and fail every call at once from then on.
    child.proc.once('exit', (code, signal) => {
      if (closed) return
      // the watchdog exits with anvil's status: 128+n when a signal killed it
      const killedBy = signal ?? (code !== null && code > 128 ? Object.entries(os.constants.signals).find(([, n]) => n === code - 128)?.[0] : undefined) ?? null
      dead = new DevnetUnavailableError(`embedded chain: anvil exited unexpectedly (${killedBy ?? `code ${code}`}); restart Paygate`)
      log('anvil exited unexpectedly', { code: killedBy ? null : code, signal: killedBy, stderr: child.stderrTail().slice(-500) }, 'error')
      child.ipc.fail(dead, true)
      clearInterval(idleTimer)
      if (mineTimer) clearTimeout(mineTimer)
      mineTimer = undefined
      for (const f of minedWaiters) f()
    })

    let closing: Promise<void> | undefined
    return {
      rpcUrl,
      chainId: opts.chainId,
      childPid: child.anvilPid,
      request,
      sendRawTransactions,
      stats: () => ({ blocks, generation: gen, tailEntries, replayed, replayMs, loadMs, mineMs: Math.round(mineMs * 10) / 10, snapshotMs: [...snapshotMs] }),
      close: () =>
        (closing ??= (async () => {
          clearInterval(idleTimer)
          if (mineTimer) clearTimeout(mineTimer)
          mineTimer = undefined
          await serial(async () => {
            // a tail of blocks mined only for chain time replays in milliseconds
            if (tailEntries > freshTail && !dead) await snapshot()
            closed = true
          }).catch((e: unknown) => {
            closed = true
            log('final snapshot failed (the journal still holds everything)', { error: String(e) }, 'warn')
          })
          await commits
          for (const f of minedWaiters) f()
          server.closeAllConnections()
          await new Promise<void>((r) => server.close(() => r()))
          fs.fsyncSync(fd)
          fs.closeSync(fd)
          await stopAnvil(child)
          fs.rmSync(pidFile, { force: true })
          unlock()
        })()),
    }
  } catch (e) {
    closed = true
    await stopAnvil(child)
    unlock()
    throw e
  }
}
