/**
 * Soak benchmark of the embedded chain (src/chain/devnet.ts): starts it in a temp dir, deploys the
 * PaymentLedger, records 20,000 entries (one sender, locally managed nonces, a few in flight) and
 * prints record throughput fresh vs after 20k (ratio), RSS (node + anvil), restart time with the
 * full history, and checks that the history survived. Bounded: stops sending after 150 s.
 *
 *   npx tsx bench/devnet-soak.ts [--records 20000] [--inflight 8] [--block-time 250] [--chain-id 31337]
 */
import * as fs from 'node:fs'
import * as os from 'node:os'
import * as path from 'node:path'
import { encodeFunctionData, keccak256, toHex, type Abi, type Hex } from 'viem'
import { mnemonicToAccount } from 'viem/accounts'
import { DEVNET_MNEMONIC, startDevnet, type Devnet } from '../src/chain/devnet/index.js'

const artifacts = JSON.parse(fs.readFileSync(new URL('../src/chain/contracts/artifacts.json', import.meta.url), 'utf8')) as {
  PaymentLedger: { abi: Abi; bytecode: Hex }
}
const { abi, bytecode } = artifacts.PaymentLedger

const arg = (name: string, dflt: number): number => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : dflt
}
const RECORDS = arg('records', 20_000)
const INFLIGHT = arg('inflight', 8)
const BLOCK_TIME = arg('block-time', 250)
const CHAIN_ID = arg('chain-id', 31337)
const WINDOW = Math.min(2000, Math.floor(RECORDS / 10))
const SEND_DEADLINE = Date.now() + 150_000

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'paygate-devnet-soak-'))
const account = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 1 })
let nonce = 0
let seq = 0

const rssMb = (pid: number): { node: number; anvil: number; total: number } => {
  const node = process.memoryUsage().rss / 2 ** 20
  let anvil = 0
  try {
    anvil = Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) / 1024
  } catch {}
  return { node: Math.round(node), anvil: Math.round(anvil), total: Math.round(node + anvil) }
}

async function sendRecord(d: Devnet, ledger: Hex): Promise<Hex> {
  const i = seq++
  const data = encodeFunctionData({
    abi,
    functionName: 'record',
    args: [
      keccak256(toHex(`payment-${i}`)),
      keccak256(toHex(`parent-${i}`)),
      `agent-${i % 50}`,
      BigInt(10_000 + i),
      i % 2 ? 'x402' : 'mpp',
      `https://merchant${i % 20}.example`,
      keccak256(toHex(`/api/v1/items/${i}`)),
      i % 4,
    ],
  })
  const tx = await account.signTransaction({
    chainId: CHAIN_ID,
    type: 'eip1559',
    to: ledger,
    data,
    nonce: nonce++,
    gas: 400_000n,
    maxFeePerGas: 100_000_000_000n,
    maxPriorityFeePerGas: 1n,
  })
  return (await d.request({ method: 'eth_sendRawTransaction', params: [tx] })) as Hex
}

async function receipt(d: Devnet, hash: Hex): Promise<{ status: string; contractAddress?: Hex; blockNumber: string }> {
  const until = Date.now() + 30_000
  while (Date.now() < until) {
    const r = (await d.request({ method: 'eth_getTransactionReceipt', params: [hash] })) as { status: string; contractAddress?: Hex; blockNumber: string } | null
    if (r) {
      if (r.status !== '0x1') throw new Error(`transaction ${hash} reverted`)
      return r
    }
    await new Promise((res) => setTimeout(res, 10))
  }
  throw new Error(`no receipt for ${hash}`)
}

/** Send `count` records with `inflight` concurrent senders; tx/s until the last one is mined. */
async function phase(d: Devnet, ledger: Hex, count: number, inflight: number): Promise<{ sent: number; txPerSec: number }> {
  const t0 = performance.now()
  let started = 0
  let last: Hex | undefined
  const worker = async (): Promise<void> => {
    while (started < count && Date.now() < SEND_DEADLINE) {
      started++
      last = await sendRecord(d, ledger)
    }
  }
  await Promise.all(Array.from({ length: inflight }, worker))
  if (last) await receipt(d, last)
  return { sent: started, txPerSec: Math.round(started / ((performance.now() - t0) / 1000)) }
}

/** One record at a time, each waiting for its receipt (how a mutex-guarded writer behaves). */
async function sequential(d: Devnet, ledger: Hex, count: number): Promise<number> {
  const t0 = performance.now()
  for (let i = 0; i < count; i++) await receipt(d, await sendRecord(d, ledger))
  return Math.round(count / ((performance.now() - t0) / 1000))
}

const countOf = async (d: Devnet, ledger: Hex): Promise<number> =>
  Number(BigInt((await d.request({ method: 'eth_call', params: [{ to: ledger, data: encodeFunctionData({ abi, functionName: 'count' }) }, 'latest'] })) as string))

const t00 = Date.now()
const log = process.env.DEVNET_LOG ? (msg: string, fields?: object): void => console.error(`${Date.now() - t00}ms ${msg}`, JSON.stringify(fields ?? {})) : undefined
const opts = { dataDir: dir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, blockTimeMs: BLOCK_TIME, ...(log ? { log } : {}) }
try {
  let t = performance.now()
  let d = await startDevnet(opts)
  const startFreshMs = Math.round(performance.now() - t)
  const deploy = await account.signTransaction({ chainId: CHAIN_ID, type: 'eip1559', data: bytecode, nonce: nonce++, gas: 5_000_000n, maxFeePerGas: 100_000_000_000n, maxPriorityFeePerGas: 1n })
  const ledger = (await receipt(d, (await d.request({ method: 'eth_sendRawTransaction', params: [deploy] })) as Hex)).contractAddress!

  log?.('phase fresh')
  const fresh = await phase(d, ledger, WINDOW, INFLIGHT)
  const seqFresh = await sequential(d, ledger, 50)
  const mineMsFresh = d.stats().mineMs
  log?.('phase fill')
  const tFill = performance.now()
  const fill = await phase(d, ledger, RECORDS - 2 * WINDOW - 100, 16)
  const fillSec = (performance.now() - tFill) / 1000
  log?.('phase after')
  const after = await phase(d, ledger, WINDOW, INFLIGHT)
  const seqAfter = await sequential(d, ledger, 50)
  log?.('phase done')
  const recorded = await countOf(d, ledger)
  const rss = rssMb(d.childPid)
  const statsBefore = d.stats()

  t = performance.now()
  await d.close()
  const closeMs = Math.round(performance.now() - t)
  const stateMb = Math.round(
    fs
      .readdirSync(dir)
      .filter((f) => f.startsWith('snap-'))
      .reduce((s, f) => s + fs.statSync(path.join(dir, f, 'state.json')).size, 0) /
      2 ** 20,
  )

  t = performance.now()
  d = await startDevnet(opts)
  const restartMs = Math.round(performance.now() - t)
  const recordedAfterRestart = await countOf(d, ledger)
  const afterRestart = await phase(d, ledger, WINDOW, INFLIGHT)
  await d.request({ method: 'evm_mine' })
  const head = (await d.request({ method: 'eth_getBlockByNumber', params: ['latest', false] })) as { timestamp: string }
  const chainTimeLagS = Math.floor(Date.now() / 1000) - Number(head.timestamp)
  const rssAfterRestart = rssMb(d.childPid)
  await d.close()

  const result = {
    records: recorded,
    inflight: INFLIGHT,
    blockTimeMs: BLOCK_TIME,
    startFreshMs,
    txPerSecFresh: fresh.txPerSec,
    txPerSecFill: Math.round(fill.sent / fillSec),
    txPerSecAfter: after.txPerSec,
    ratioFreshToAfter: +(fresh.txPerSec / Math.max(1, after.txPerSec)).toFixed(2),
    sequentialTxPerSecFreshAfter: [seqFresh, seqAfter],
    rssMb: rss,
    blocks: statsBefore.blocks,
    mineMsFreshAfter: [mineMsFresh, statsBefore.mineMs],
    snapshotsMs: statsBefore.snapshotMs,
    closeMs,
    stateMb,
    restartMs,
    historyKept: recordedAfterRestart === recorded,
    txPerSecAfterRestart: afterRestart.txPerSec,
    rssAfterRestartMb: rssAfterRestart,
    chainTimeLagS,
  }
  console.log(
    `fresh ${result.txPerSecFresh} tx/s, after ${recorded} records ${result.txPerSecAfter} tx/s (ratio ${result.ratioFreshToAfter}), sustained fill ${result.txPerSecFill} tx/s; one at a time waiting for each receipt: ${seqFresh} / ${seqAfter} tx/s`,
  )
  console.log(`a block takes ${mineMsFresh} ms to mine fresh, ${statsBefore.mineMs} ms after; snapshots held the chain ${statsBefore.snapshotMs.join(', ')} ms`)
  console.log(`RSS node ${rss.node} MB + anvil ${rss.anvil} MB = ${rss.total} MB; restart with ${recorded} records: ${restartMs} ms (state ${stateMb} MB); history kept: ${result.historyKept}`)
  console.log(JSON.stringify(result))
  if (!result.historyKept || result.chainTimeLagS > 5 || result.chainTimeLagS < -5) process.exitCode = 1
} finally {
  fs.rmSync(dir, { recursive: true, force: true })
}
