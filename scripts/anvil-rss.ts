/**
 * anvil's RSS per mined tx, standalone (issue 28): starts the embedded chain's anvil binary with
 * the devnet's flags on loopback, sends signed txs in blocks mined with `evm_mine`, and prints
 * anvil's RSS (and CPU) every 10,000 txs. One thing varies per run:
 *
 *   npx tsx scripts/anvil-rss.ts [--txs 100000] [--per-block 250] [--keeper 8|none]
 *     [--prune 32|none|bare] [--kind transfer|ledger] [--order fifo|fees] [--receipts 0|1]
 *     [--every 0] [--rpc anvil_method] [--window 10000]
 *
 * `--per-block 0`: empty blocks only, each counted as one tx (what a block costs by itself).
 * `--compact N`: every N blocks, reload the headers of the blocks anvil has pruned (see
 * compact()), to test whether that frees what their pruning left.
 * `--every N --rpc M`: call anvil method M (no params) every N blocks (to test whether a call
 * drops what grows). Loopback only; bounded by --txs and --max-s (default 300). Only the anvil
 * this script starts is killed, by its pid.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import * as fs from 'node:fs'
import type { Hex } from 'viem'
import { mnemonicToAccount } from 'viem/accounts'
import { anvilBinary } from '../src/chain/devnet/anvil.js'
import { NEW_CHAIN_HARDFORK } from '../src/chain/devnet/data-dir.js'
import { DEVNET_MNEMONIC } from '../src/chain/devnet/index.js'
import { signEip1559 } from '../src/chain/eip1559.js'
import { encodeRecordCall } from '../src/chain/ledger-call.js'
import { keccak256Bytes } from '../src/crypto/keccak.js'
import { entryOf } from '../bench/ledger-entries.js'
import { FastSigner } from '../src/crypto/secp256k1.js'
import { anvilAnswers, deployLedger } from './bare-anvil.js'
import { freePort } from '../test/helpers/ports.js'

const argv = process.argv.slice(2)
const opt = (name: string, dflt: string): string => {
  const i = argv.indexOf(`--${name}`)
  return i >= 0 ? argv[i + 1]! : dflt
}
const TXS = Number(opt('txs', '100000'))
const PER_BLOCK = Number(opt('per-block', '250'))
const KEEPER = opt('keeper', '8')
const PRUNE = opt('prune', '32')
const KIND = opt('kind', 'ledger')
const ORDER = opt('order', 'fifo')
const RECEIPTS = opt('receipts', '0') === '1'
const EVERY = Number(opt('every', '0'))
const RPC = opt('rpc', '')
const MAX_S = Number(opt('max-s', '300'))
const COMPACT = Number(opt('compact', '0'))
const KEEP = KEEPER === 'none' ? 0 : Number(KEEPER)
const WINDOW = Number(opt('window', '10000'))
const CHAIN_ID = 31337

const account = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 1 })
const signer = new FastSigner(`0x${Buffer.from(account.getHdKey().privateKey!).toString('hex')}`)

const status = (pid: number): { rssKb: number; anonKb: number } => {
  const t = fs.readFileSync(`/proc/${pid}/status`, 'utf8')
  return { rssKb: Number(/VmRSS:\s+(\d+)/.exec(t)?.[1]), anonKb: Number(/RssAnon:\s+(\d+)/.exec(t)?.[1]) }
}
const cpuMs = (pid: number): number => {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')
  return (Number(f[11]) + Number(f[12])) * 10
}

let url = ''
let id = 1
type Res = { id: number; result?: unknown; error?: { message: string } }
async function batch(calls: { method: string; params: unknown[] }[]): Promise<Res[]> {
  const body = calls.map((c) => ({ jsonrpc: '2.0', id: id++, ...c }))
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
  const out = (await r.json()) as Res[]
  const bad = out.find((x) => x.error)
  if (bad) throw new Error(`${calls[0]!.method}: ${bad.error!.message}`)
  return out.sort((a, b) => a.id - b.id)
}
const call = async (method: string, params: unknown[] = []): Promise<unknown> => (await batch([{ method, params }]))[0]!.result

const SINK = Buffer.from('00000000000000000000000000000000000000aa', 'hex')
const sign = (nonce: number, to: Uint8Array, data: Uint8Array, gas: bigint): Hex =>
  `0x${signEip1559({ chainId: CHAIN_ID, nonce: BigInt(nonce), gas, maxFeePerGas: 100_000_000_000n, maxPriorityFeePerGas: 1n, to, value: to === SINK ? 1n : 0n, data }, (p) => signer.signDigestBytes(keccak256Bytes(p))).toString('hex')}`

const hex = (n: number | bigint): string => `0x${n.toString(16)}`
let compacted = 0 // blocks 1..compacted have been reloaded
let anvilPid = 0
const compactTimes: { blocks: number; fetchMs: number; loadMs: number; fetchCpuMs: number; loadCpuMs: number }[] = []
/** Reload the headers of pruned blocks (empty bodies) with anvil_loadState, then restore the next base fee it resets. */
async function compact(best: number): Promise<number> {
  const upTo = best - KEEP - 1
  if (upTo <= compacted) return 0
  const t0 = performance.now()
  const c0 = cpuMs(anvilPid)
  const nums: number[] = []
  for (let n = compacted + 1; n <= upTo; n++) nums.push(n)
  const blocks: unknown[] = []
  for (let k = 0; k < nums.length; k += 250) {
    const rs = await batch(nums.slice(k, k + 250).map((n) => ({ method: 'eth_getBlockByNumber', params: [hex(n), false] })))
    for (const r of rs) {
      const { hash, size, totalDifficulty, transactions, uncles, withdrawals, ...header } = r.result as Record<string, unknown>
      blocks.push({ header, transactions: [], ommers: [], withdrawals: null, _hash: hash })
    }
  }
  const hashes = blocks.map((b) => (b as { _hash: string })._hash)
  for (const b of blocks) delete (b as { _hash?: string })._hash
  const t1 = performance.now()
  const c1 = cpuMs(anvilPid)
  const info = (await call('anvil_nodeInfo')) as { environment: { baseFee: number | string } }
  const state = { block: null, accounts: {}, best_block_number: null, blocks, transactions: [] }
  await call('anvil_loadState', [`0x${Buffer.from(JSON.stringify(state)).toString('hex')}`])
  await call('anvil_setNextBlockBaseFeePerGas', [hex(BigInt(info.environment.baseFee))])
  const after = await batch([nums[0]!, nums.at(-1)!].map((n) => ({ method: 'eth_getBlockByNumber', params: [hex(n), false] })))
  if ((after[0]!.result as { hash: string }).hash !== hashes[0] || (after[1]!.result as { hash: string }).hash !== hashes.at(-1)) throw new Error('a reloaded block changed its hash')
  compacted = upTo
  const t2 = performance.now()
  const c2 = cpuMs(anvilPid)
  compactTimes.push({ blocks: nums.length, fetchMs: t1 - t0, loadMs: t2 - t1, fetchCpuMs: c1 - c0, loadCpuMs: c2 - c1 })
  return nums.length
}

/** anvil with the devnet's flags and this run's, on a free loopback port; killed by its pid at exit too. */
async function startAnvil(): Promise<{ pid: number; stop(): void }> {
  const port = await freePort()
  url = `http://127.0.0.1:${port}`
  const args = ['--silent', '--host', '127.0.0.1', '--port', String(port), '--no-mining', '--order', ORDER, '--chain-id', String(CHAIN_ID)]
  args.push('--hardfork', NEW_CHAIN_HARDFORK, '--gas-limit', '100000000')
  // none: anvil's default (500 states in memory, more on disk); bare: the flag without a value (no states kept)
  if (PRUNE === 'bare') args.push('--prune-history')
  else if (PRUNE !== 'none') args.push('--prune-history', PRUNE)
  if (KEEPER !== 'none') args.push('--transaction-block-keeper', KEEPER)
  const anvil: ChildProcess = spawn(anvilBinary(), args, { stdio: ['ignore', 'ignore', 'inherit'] })
  const pid = anvil.pid!
  anvilPid = pid
  const stop = (): void => {
    try {
      process.kill(pid, 'SIGKILL')
    } catch {}
  }
  process.on('exit', stop)
  return { pid, stop }
}

async function main(): Promise<void> {
  const { pid, stop } = await startAnvil()
  try {
    await anvilAnswers(call)
    const deadline = Date.now() + MAX_S * 1000
    let nonce = 0
    let to = SINK as Uint8Array
    if (KIND === 'ledger') to = await deployLedger(call, account, CHAIN_ID, nonce++)
    const s0 = status(pid)
    console.log(
      JSON.stringify({
        run: { txs: TXS, perBlock: PER_BLOCK, keeper: KEEPER, prune: PRUNE, kind: KIND, order: ORDER, receipts: RECEIPTS, compact: COMPACT, every: EVERY, rpc: RPC },
        startRssMb: +(s0.rssKb / 1024).toFixed(1),
      }),
    )
    let sent = 0
    let blocks = 0
    let win = { cpu: cpuMs(pid), rss: s0.rssKb }
    const first = { rss: 0, n: 0 }
    while (sent < TXS && Date.now() < deadline) {
      const n = Math.min(PER_BLOCK, TXS - sent) // (--per-block 0: empty blocks, counted as one tx each)
      const raws: Hex[] = []
      for (let k = 0; k < n; k++) raws.push(KIND === 'ledger' ? sign(nonce++, to, encodeRecordCall(entryOf(sent + k)), 200_000n) : sign(nonce++, to, new Uint8Array(), 21_000n))
      await sendAndMine(raws)
      blocks++
      if (EVERY && RPC && blocks % EVERY === 0) await call(RPC)
      if (COMPACT && blocks % COMPACT === 0) await compact(Number(await call('eth_blockNumber')))
      const before = Math.floor(sent / WINDOW)
      sent += n || 1
      if (Math.floor(sent / WINDOW) > before) win = printWindow(pid, sent, blocks, win, first)
    }
    const s = status(pid)
    const slope = first.n && sent > first.n ? { kbPerTxAfter2Windows: +((s.rssKb - first.rss) / (sent - first.n)).toFixed(3) } : {}
    console.log(JSON.stringify({ end: sent, blocks, rssMb: +(s.rssKb / 1024).toFixed(1), ...slope }))
  } finally {
    stop()
  }
}

/** One block: its txs sent 250 to a batch, mined with `evm_mine`, and with --receipts 1 every receipt asked for. */
async function sendAndMine(raws: Hex[]): Promise<void> {
  const hashes: Hex[] = []
  for (let k = 0; k < raws.length; k += 250) {
    const rs = await batch(raws.slice(k, k + 250).map((raw) => ({ method: 'eth_sendRawTransaction', params: [raw] })))
    for (const r of rs) hashes.push(r.result as Hex)
  }
  await call('evm_mine')
  if (RECEIPTS) {
    for (let k = 0; k < hashes.length; k += 250) {
      const rs = await batch(hashes.slice(k, k + 250).map((h) => ({ method: 'eth_getTransactionReceipt', params: [h] })))
      if (rs.some((r) => !r.result)) throw new Error('a receipt is missing right after its block')
    }
  }
}

/** A window's line (anvil's RSS and CPU per tx since `win`), the compactions in it, and the next window's start; `first` takes the figures after two windows. */
function printWindow(pid: number, sent: number, blocks: number, win: { cpu: number; rss: number }, first: { rss: number; n: number }): { cpu: number; rss: number } {
  const s = status(pid)
  const cpu = cpuMs(pid)
  if (!first.n && sent >= 2 * WINDOW) Object.assign(first, { rss: s.rssKb, n: sent })
  console.log(
    JSON.stringify({
      txs: sent,
      blocks,
      rssMb: +(s.rssKb / 1024).toFixed(1),
      anonMb: +(s.anonKb / 1024).toFixed(1),
      kbPerTxWindow: +((s.rssKb - win.rss) / WINDOW).toFixed(3),
      anvilCpuMsPerTx: +((cpu - win.cpu) / WINDOW).toFixed(3),
    }),
  )
  if (compactTimes.length) printCompactions()
  return { cpu, rss: s.rssKb }
}

/** The compactions since the last window, summed up, then forgotten. */
function printCompactions(): void {
  const max = (k: 'fetchMs' | 'loadMs' | 'fetchCpuMs' | 'loadCpuMs'): number => Math.round(Math.max(...compactTimes.map((c) => c[k])))
  const sum = (k: 'blocks' | 'fetchCpuMs' | 'loadCpuMs'): number => compactTimes.reduce((a, c) => a + c[k], 0)
  const per = (k: 'fetchCpuMs' | 'loadCpuMs'): number => +(sum(k) / sum('blocks')).toFixed(3)
  console.log(
    JSON.stringify({
      compactions: compactTimes.length,
      blocks: sum('blocks'),
      maxWallMs: { fetch: max('fetchMs'), load: max('loadMs') },
      anvilCpuMsPerBlock: { fetch: per('fetchCpuMs'), load: per('loadCpuMs') },
    }),
  )
  compactTimes.length = 0
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
