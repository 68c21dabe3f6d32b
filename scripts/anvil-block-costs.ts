/**
 * What a block costs anvil, by its size, standalone (issue 28): starts the embedded chain's anvil
 * binary with the devnet's flags on loopback, deploys the PaymentLedger and, for each block size,
 * sends that many ledger calls (signed natively, 250 to a batch), mines them with `evm_mine` and
 * reads the block's receipts with `eth_getBlockReceipts`, as the devnet's miner and receipt
 * archive do, and, for comparison, its logs (`eth_getLogs`) and the block with its txs
 * (`eth_getBlockByNumber`, full). Meanwhile a second connection sends one tx during the mine
 * and one during the receipts read, to see whether anvil answers it meanwhile. `--unsigned`
 * sends the ledger calls as the embedded chain does (`eth_sendTransaction` from the recorder's
 * account, impersonated: anvil recovers no sender, and hashes such a tx each time it needs
 * its hash). Prints the median of `--rounds` per size:
 *
 *   npx tsx scripts/anvil-block-costs.ts [--sizes 100,250,1000] [--rounds 5] [--unsigned]
 *
 * Loopback only; bounded by sizes x rounds. Only the anvil this script starts is killed, by its pid.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { Agent, request } from 'undici'
import type { Hex } from 'viem'
import { mnemonicToAccount } from 'viem/accounts'
import { entryOf } from '../bench/ledger-entries.js'
import { anvilBinary } from '../src/chain/devnet/anvil.js'
import { NEW_CHAIN_HARDFORK } from '../src/chain/devnet/data-dir.js'
import { DEVNET_MNEMONIC } from '../src/chain/devnet/index.js'
import { signEip1559 } from '../src/chain/eip1559.js'
import { encodeRecordCall } from '../src/chain/ledger-call.js'
import { keccak256Bytes } from '../src/crypto/keccak.js'
import { FastSigner } from '../src/crypto/secp256k1.js'
import { anvilAnswers, deployLedger } from './bare-anvil.js'
import { freePort } from '../test/helpers/ports.js'

const argv = process.argv.slice(2)
const opt = (name: string, dflt: string): string => {
  const i = argv.indexOf(`--${name}`)
  return i >= 0 ? argv[i + 1]! : dflt
}
const SIZES = opt('sizes', '100,250,1000').split(',').map(Number)
const ROUNDS = Number(opt('rounds', '5'))
const UNSIGNED = argv.includes('--unsigned')
const CHAIN_ID = 31337

const signerOf = (i: number): { account: ReturnType<typeof mnemonicToAccount>; fast: FastSigner } => {
  const account = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: i })
  return { account, fast: new FastSigner(`0x${Buffer.from(account.getHdKey().privateKey!).toString('hex')}`) }
}
const recorder = signerOf(1)
const other = signerOf(2)

// two connections: the filler's, and the one that sends while anvil mines or serves receipts
const main = new Agent({ connections: 1 })
const side = new Agent({ connections: 1 })
let url = ''
let id = 1
type Res = { result?: unknown; error?: { message: string } }
async function batch(calls: { method: string; params: unknown[] }[], via = main): Promise<Res[]> {
  const body = JSON.stringify(calls.map((c) => ({ jsonrpc: '2.0', id: id++, ...c })))
  const r = await request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body, dispatcher: via })
  const out = (await r.body.json()) as Res[]
  const bad = out.find((x) => x.error)
  if (bad) throw new Error(`${calls[0]!.method}: ${bad.error!.message}`)
  return out
}
const call = async (method: string, params: unknown[] = [], via = main): Promise<unknown> => (await batch([{ method, params }], via))[0]!.result

const sign = (by: FastSigner, nonce: number, to: Uint8Array, data: Uint8Array, gas: bigint): Hex =>
  `0x${signEip1559({ chainId: CHAIN_ID, nonce: BigInt(nonce), gas, maxFeePerGas: 100_000_000_000n, maxPriorityFeePerGas: 1n, to, value: 0n, data }, (p) => by.signDigestBytes(keccak256Bytes(p))).toString('hex')}`
const SINK = Buffer.from('00000000000000000000000000000000000000aa', 'hex')

const timed = async <T>(p: () => Promise<T>): Promise<[T, number]> => {
  const t = performance.now()
  const v = await p()
  return [v, performance.now() - t]
}
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!

async function run(): Promise<void> {
  const port = await freePort()
  url = `http://127.0.0.1:${port}`
  const args = ['--silent', '--host', '127.0.0.1', '--port', String(port), '--no-mining', '--order', 'fifo', '--chain-id', String(CHAIN_ID)]
  args.push('--hardfork', NEW_CHAIN_HARDFORK, '--gas-limit', '100000000', '--prune-history', '32', '--transaction-block-keeper', '2')
  const anvil: ChildProcess = spawn(anvilBinary(), args, { stdio: ['ignore', 'ignore', 'inherit'] })
  process.on('exit', () => {
    try {
      process.kill(anvil.pid!, 'SIGKILL')
    } catch {}
  })
  await anvilAnswers(call)
  let nonce = 0
  let sideNonce = 0
  const to = await deployLedger(call, recorder.account, CHAIN_ID, nonce++)
  if (UNSIGNED) await call('anvil_impersonateAccount', [recorder.account.address])
  const hexOf = (b: Uint8Array): Hex => `0x${Buffer.from(b).toString('hex')}`
  const signedSend = (n: number, data: Uint8Array): { method: string; params: unknown[] } => ({ method: 'eth_sendRawTransaction', params: [sign(recorder.fast, n, to, data, 200_000n)] })
  // the fields the embedded chain's front sends for an unsigned record (sendRequest in src/chain/devnet/rpc.ts)
  const unsignedSend = (n: number, data: Uint8Array): { method: string; params: unknown[] } => ({
    method: 'eth_sendTransaction',
    params: [
      {
        type: '0x2',
        from: recorder.account.address,
        to: hexOf(to),
        data: hexOf(data),
        nonce: `0x${n.toString(16)}`,
        gas: '0x30d40',
        maxFeePerGas: '0x174876e800',
        maxPriorityFeePerGas: '0x1',
        value: '0x0',
        chainId: `0x${CHAIN_ID.toString(16)}`,
        accessList: [],
      },
    ],
  })
  const sideSend = (): Promise<unknown> => call('eth_sendRawTransaction', [sign(other.fast, sideNonce++, SINK, new Uint8Array(), 21_000n)], side)
  let k = 0
  for (const size of SIZES) {
    const got = {
      sendPerTxMs: [] as number[],
      mineMs: [] as number[],
      receiptsMs: [] as number[],
      logsMs: [] as number[],
      blockMs: [] as number[],
      sendDuringMineMs: [] as number[],
      sendDuringReceiptsMs: [] as number[],
    }
    for (let round = 0; round < ROUNDS + 1; round++) {
      const sends = Array.from({ length: size }, () => (UNSIGNED ? unsignedSend(nonce++, encodeRecordCall(entryOf(k++))) : signedSend(nonce++, encodeRecordCall(entryOf(k++)))))
      const [, sendMs] = await timed(async () => {
        for (let j = 0; j < sends.length; j += 250) await batch(sends.slice(j, j + 250))
      })
      const mine = timed(() => call('evm_mine'))
      await sleep(2)
      const [, duringMine] = await timed(sideSend)
      const [, mineMs] = await mine
      const blockNumber = ((await call('eth_getBlockByNumber', ['latest', false])) as { number: string }).number
      const receipts = timed(() => call('eth_getBlockReceipts', [blockNumber]))
      await sleep(2)
      const [, duringReceipts] = await timed(sideSend)
      const [rs, receiptsMs] = await receipts
      if ((rs as unknown[]).length < size) throw new Error(`block ${blockNumber} holds ${(rs as unknown[]).length} receipts, not ${size}`)
      // The same block's logs alone: anvil builds each receipt from a copy of the whole block and its receipts.
      const [, logsMs] = await timed(() => call('eth_getLogs', [{ fromBlock: blockNumber, toBlock: blockNumber }]))
      const [, blockMs] = await timed(() => call('eth_getBlockByNumber', [blockNumber, true]))
      await call('evm_mine') // the side txs
      if (round === 0) continue // warm-up
      got.sendPerTxMs.push(sendMs / size)
      got.mineMs.push(mineMs)
      got.receiptsMs.push(receiptsMs)
      got.logsMs.push(logsMs)
      got.blockMs.push(blockMs)
      got.sendDuringMineMs.push(duringMine)
      got.sendDuringReceiptsMs.push(duringReceipts)
    }
    const m = Object.fromEntries(Object.entries(got).map(([key, xs]) => [key, key === 'sendPerTxMs' ? +median(xs).toFixed(3) : +median(xs).toFixed(1)]))
    console.log(JSON.stringify({ txsPerBlock: size, unsigned: UNSIGNED, rounds: ROUNDS, median: m }))
  }
  process.exit(0)
}

await run()
