/**
 * The embedded chain trims anvil's old block headers at a snapshot (reset, and loaded back from
 * that dump with the newest 256 headers): the newest block keeps its hash, state and the txs
 * waiting in the pool survive, old receipts still come from the archive, and a restart from the
 * trimmed snapshot is the same chain. The pool's txs go back in blocks of at most 32, and a
 * restart from the snapshot before (the trimmed one's files unwritten) mines the same blocks.
 * A dev method whose effect a dump does not hold turns trimming off.
 */
import t, { type Test } from 'tap'
import { copyFileSync, cpSync, mkdirSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import type { Hex } from 'viem'
import { mnemonicToAccount } from 'viem/accounts'
import { DEVNET_MNEMONIC, startDevnet, type Devnet } from '../../src/chain/devnet/index.js'
import { unsignedEip1559 } from '../../src/chain/eip1559.js'
import type { DevnetLog } from '../../src/chain/devnet/types.js'
import { testDir } from '../helpers/gateway.js'

const CHAIN_ID = 31337
// No blocks for chain time (freshBlockMs): a restart is compared with the live chain at 'latest',
// and a read of it more than 2 s after the newest block (a restart on a loaded machine) mined an
// empty block first.
const open = (dataDir: string, log?: DevnetLog): Promise<Devnet> =>
  startDevnet({ dataDir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, idleSnapshotMs: 600_000, freshBlockMs: 600_000, trimEveryBlocks: 256, log })
const from = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 4 })
const recipient = (nonce: number): Hex => `0x${'dd'.repeat(18)}${nonce.toString(16).padStart(4, '0')}`
const transfer = (nonce: number, to = recipient(nonce)) =>
  ({ chainId: CHAIN_ID, type: 'eip1559', nonce, to, value: BigInt(nonce + 1), gas: 21_000n, maxFeePerGas: 10n ** 10n, maxPriorityFeePerGas: 1n }) as const
const tx = (nonce: number): Promise<Hex> => from.signTransaction(transfer(nonce))
/** As ledger records go: unsigned, sent as `from` impersonated (RpcFront.sendLedger). */
const unsignedTx = (nonce: number): Hex => {
  const { chainId, to, value, gas, maxFeePerGas, maxPriorityFeePerGas } = transfer(nonce)
  const f = { chainId, nonce: BigInt(nonce), to: Buffer.from(to.slice(2), 'hex'), value, gas, maxFeePerGas, maxPriorityFeePerGas, data: new Uint8Array() }
  return `0x${unsignedEip1559(f).toString('hex')}`
}
const other = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 5 })
type Block = { hash: Hex; number: Hex; timestamp: Hex; transactions: Hex[] }
const block = (c: Devnet, n: number | 'latest'): Promise<Block | null> =>
  c.request({ method: 'eth_getBlockByNumber', params: [typeof n === 'number' ? `0x${n.toString(16)}` : n, false] }) as Promise<Block | null>
/** The chain's files as a SIGKILL would leave them (no lock or pid file). */
const copyChain = (from: string, to: string): void => {
  mkdirSync(to, { recursive: true })
  for (const f of readdirSync(from)) if (/^(chain\.json|journal-\d+\.ndjson|snap-\d+|receipts)$/.test(f)) cpSync(join(from, f), join(to, f), { recursive: true })
}
type Receipt = { status: Hex; blockHash: Hex; blockNumber: Hex }
const receipt = (c: Devnet, h: string): Promise<Receipt | null> => c.request({ method: 'eth_getTransactionReceipt', params: [h] }) as Promise<Receipt | null>
const balance = async (c: Devnet, nonce: number): Promise<bigint> => BigInt((await c.request({ method: 'eth_getBalance', params: [recipient(nonce), 'latest'] })) as Hex)
async function waitReceipt(c: Devnet, h: string): Promise<Receipt> {
  for (let until = Date.now() + 10_000; Date.now() < until; await new Promise((r) => setTimeout(r, 10))) {
    const r = await receipt(c, h)
    if (r) return r
  }
  throw new Error(`no receipt for ${h}`)
}
const hashOf = (r: Awaited<ReturnType<Devnet['sendRawTransactions']>>[number]): string => ('hash' in r ? r.hash : 'refused')

t.test('a snapshot past the trim point drops old headers; newest block, state, pool and receipts stay; a restart is the same chain', async (t: Test) => {
  const dir = testDir(t, 'paygate-devnet-')
  const copy = testDir(t, 'paygate-devnet-copy-')
  const chain = await open(dir)
  const first = hashOf((await chain.sendRawTransactions([await tx(0)]))[0]!)
  const firstReceipt = await receipt(chain, first)
  t.equal(firstReceipt?.status, '0x1')
  await chain.request({ method: 'evm_increaseTime', params: [3600] })
  await chain.request({ method: 'anvil_mine', params: ['0x12c'] }) // 300 blocks
  // a tx waiting behind a nonce gap (nonce 2 before 1): in the pool across the trim (no blocks meanwhile)
  await chain.request({ method: 'evm_setAutomine', params: [false] })
  const waiting = hashOf((await chain.sendRawTransactions([await tx(2)]))[0]!)
  const before = await block(chain, 'latest')
  t.ok(await block(chain, 1), 'block 1 before the trim')

  await chain.snapshot()
  t.equal(chain.stats().trims, 1, 'the snapshot trimmed')
  t.equal(await block(chain, 1), null, 'block 1 is gone')
  t.same(await block(chain, 'latest'), before, 'the newest block is the same')
  t.same(await receipt(chain, first), firstReceipt, 'an old receipt comes from the archive')
  t.equal(await balance(chain, 0), 1n, 'state is there')
  await chain.request({ method: 'evm_setAutomine', params: [true] })
  await chain.sendRawTransactions([await tx(1)])
  t.equal((await receipt(chain, waiting))?.status, '0x1', 'the tx waiting in the pool is mined once the gap is filled')
  const after = await block(chain, 'latest')
  // the reset zeroes anvil's time offset: without it put back, the next block would be an hour earlier
  t.ok(Number(after!.timestamp) >= Number(before!.timestamp), 'the next block is not earlier than the newest')
  t.ok(Number(after!.timestamp) >= Math.floor(Date.now() / 1000) + 3500, 'chain time kept its offset (an hour ahead)')
  t.equal(await balance(chain, 2), 3n)

  // What a SIGKILL leaves after the trimmed snapshot.
  const gen = chain.stats().generation
  mkdirSync(copy, { recursive: true })
  for (const f of ['chain.json', `journal-${gen}.ndjson`]) copyFileSync(join(dir, f), join(copy, f))
  cpSync(join(dir, `snap-${gen}`), join(copy, `snap-${gen}`), { recursive: true })
  cpSync(join(dir, 'receipts'), join(copy, 'receipts'), { recursive: true })
  await chain.close()
  const restarted = await open(copy)
  t.teardown(() => restarted.close())
  t.same(await block(restarted, 'latest'), after, 'a restart from the trimmed snapshot has the same newest block')
  t.equal(await balance(restarted, 2), 3n)
  t.same(await receipt(restarted, first), firstReceipt)

  // The trim point comes back with the snapshot: the restart does not trim again at once, only
  // once another trimEveryBlocks blocks are mined.
  await restarted.snapshot()
  t.equal(restarted.stats().trims, 0, 'no trim at the first snapshot after the restart')
  await restarted.request({ method: 'anvil_mine', params: ['0x100'] }) // 256 blocks
  await restarted.snapshot()
  t.equal(restarted.stats().trims, 1, 'a trim once 256 more blocks are mined')
})

t.test('after a trim the pool goes back in blocks of at most 32; a restart from either snapshot mines the same blocks', async (t: Test) => {
  const dir = testDir(t, 'paygate-devnet-')
  const older = testDir(t, 'paygate-devnet-older-')
  const newer = testDir(t, 'paygate-devnet-newer-')
  const trims: Record<string, unknown>[] = []
  const chain = await open(dir, (msg, fields) => {
    if (msg === 'chain: old block headers trimmed') trims.push({ ...fields })
  })
  t.equal((await receipt(chain, hashOf((await chain.sendRawTransactions([await tx(0)]))[0]!)))?.status, '0x1')
  await chain.request({ method: 'anvil_mine', params: ['0x12c'] }) // 300 blocks: the next snapshot trims
  await chain.request({ method: 'evm_setAutomine', params: [false] })
  // 40 unsigned from one account (sent again in pipelined runs), then 30 signed by another (one at a time)
  const unsigned = (
    await chain.sendLedger(
      from.address,
      Array.from({ length: 40 }, (_, i) => unsignedTx(i + 1)),
    )
  ).map(hashOf)
  const signed = (await chain.sendRawTransactions(await Promise.all(Array.from({ length: 30 }, (_, i) => other.signTransaction(transfer(i, recipient(100 + i))))))).map(hashOf)
  const hashes = [...unsigned, ...signed]
  const before = (await block(chain, 'latest'))!
  copyChain(dir, older) // the snapshot before the trimmed one, with the journal that sent the 70

  // Automine goes on synchronously in request(), and the snapshot's turn is queued before the
  // miner's first block can be: the 70 are in the pool when the trim resets it.
  const on = chain.request({ method: 'evm_setAutomine', params: [true] })
  await chain.snapshot()
  await on
  // (anvil keeps the txs of its newest 2 blocks only: the receipts, from the archive, say where each went)
  const mined = new Map<number, number>()
  for (const h of hashes) {
    const r = await waitReceipt(chain, h)
    t.equal(r.status, '0x1', h)
    mined.set(Number(r.blockNumber), (mined.get(Number(r.blockNumber)) ?? 0) + 1)
  }
  t.equal(chain.stats().trims, 1, 'the snapshot trimmed')
  t.match(trims, [{ resent: 70, minedBetween: 2 }], 'the trim sent the pool again with two blocks between')
  const n = Number(before.number)
  t.same(
    [...mined],
    [
      [n + 1, 32],
      [n + 2, 32],
      [n + 3, 6],
    ],
    'blocks of 32, 32, and the 6 left for the miner',
  )
  const newest = await block(chain, 'latest')
  t.equal(Number(newest!.number), n + 3)
  const firstAfter = await block(chain, n + 1)

  // the journal that starts after the trim, over the snapshot before it: as if the trimmed
  // snapshot's files were not written when the process died
  const gen = chain.stats().generation
  copyFileSync(join(dir, `journal-${gen}.ndjson`), join(older, `journal-${gen}.ndjson`))
  copyChain(dir, newer)
  await chain.close()
  for (const [what, d] of [
    ['the trimmed snapshot', newer],
    ['the snapshot before it', older],
  ] as const) {
    const restarted = await open(d)
    t.same(await block(restarted, 'latest'), newest, `a restart from ${what} has the same newest block`)
    t.same(await block(restarted, n + 1), firstAfter, 'and the first block after the trim')
    await restarted.close()
  }
})

t.test('reads made while a trim reloads anvil wait for the state to be back (between reset and load anvil is an empty chain)', async (t: Test) => {
  const chain = await open(testDir(t, 'paygate-devnet-'))
  t.teardown(() => chain.close())
  await receipt(chain, hashOf((await chain.sendRawTransactions([await tx(0)]))[0]!))
  await chain.request({ method: 'anvil_mine', params: ['0x12c'] }) // 300 blocks: the next snapshot trims
  let trimming = true
  const seen: bigint[] = []
  const reads = (async () => {
    while (trimming) seen.push(await balance(chain, 0))
  })()
  await chain.snapshot()
  trimming = false
  await reads
  t.equal(chain.stats().trims, 1, 'the snapshot trimmed')
  t.ok(seen.length > 20, `reads went on during the snapshot (${seen.length})`)
  t.same(
    seen.filter((b) => b !== 1n),
    [],
    'every read saw the state (never the empty chain of the reset)',
  )
})

t.test('a dev method whose effect a dump does not hold turns trimming off', async (t: Test) => {
  const chain = await open(testDir(t, 'paygate-devnet-'))
  t.teardown(() => chain.close())
  await chain.request({ method: 'anvil_impersonateAccount', params: [recipient(9)] })
  await chain.request({ method: 'anvil_mine', params: ['0x12c'] })
  await chain.snapshot()
  t.equal(chain.stats().trims, 0, 'no trim')
  t.ok(await block(chain, 1), 'block 1 is still there')
})
