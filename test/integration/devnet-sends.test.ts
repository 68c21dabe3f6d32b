/**
 * The embedded chain's batched send (one sender's raw transactions in one round trip to
 * anvil, one journal write): per-transaction answers, the transactions mined, and a chain
 * rebuilt from the journal alone (as after a SIGKILL) holding the same blocks.
 */
import t, { type Test } from 'tap'
import { copyFileSync, cpSync, mkdirSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import type { Hex } from 'viem'
import { mnemonicToAccount } from 'viem/accounts'
import { DEVNET_MNEMONIC, startDevnet, type Devnet } from '../../src/chain/devnet/index.js'
import { FULL_BLOCK_TXS } from '../../src/chain/devnet/miner.js'
import { testDir } from '../helpers/gateway.js'

const CHAIN_ID = 31337
/** A chain's data dir and one for a copy of its files, removed after the test. */
const dirs = (t: Test): { dir: string; copy: string } => ({ dir: testDir(t, 'paygate-devnet-'), copy: testDir(t, 'paygate-devnet-copy-') })
const open = (dataDir: string): Promise<Devnet> => startDevnet({ dataDir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, idleSnapshotMs: 600_000 })
/** Plain transfers signed by devnet account `index`, nonce n paying n + 1 wei to its own recipient (`0x<byte x 18><n>`). */
const transfers = (index: number, byte: string) => {
  const from = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: index })
  const recipient = (nonce: number): Hex => `0x${byte.repeat(18)}${nonce.toString(16).padStart(4, '0')}`
  const txOn = (chainId: number, nonce: number): Promise<Hex> =>
    from.signTransaction({ chainId, type: 'eip1559', nonce, to: recipient(nonce), value: BigInt(nonce + 1), gas: 21_000n, maxFeePerGas: 10n ** 10n, maxPriorityFeePerGas: 1n })
  // (one parameter: tx is passed to map)
  return { recipient, txOn, tx: (nonce: number): Promise<Hex> => txOn(CHAIN_ID, nonce) }
}
/** What a SIGKILL leaves with no snapshot taken: the chain's identity and its journals, copied to `copy`. */
const copyJournals = (dir: string, copy: string): void => {
  mkdirSync(copy, { recursive: true })
  for (const f of readdirSync(dir)) if (f === 'chain.json' || /^journal-\d+\.ndjson$/.test(f)) copyFileSync(join(dir, f), join(copy, f))
}
/** The hashes of blocks 1 to `latest`. */
const blocksOf = (c: Devnet, latest: number): Promise<string[]> =>
  Promise.all(Array.from({ length: latest }, async (_, i) => ((await c.request({ method: 'eth_getBlockByNumber', params: [`0x${(i + 1).toString(16)}`, false] })) as { hash: string }).hash))

t.test('one round trip for a run of transactions; a chain replayed from the journal has the same blocks', async (t) => {
  const { dir, copy } = dirs(t)
  const chain = await open(dir)
  t.teardown(() => chain.close())
  // plain accounts (low addresses are precompiles)
  const { recipient, tx, txOn } = transfers(0, 'aa')
  const raws = await Promise.all(Array.from({ length: 20 }, (_, i) => tx(i)))
  // signed for another chain: the node refuses it, and only it (anvil takes a run in any order)
  const foreign = await txOn(CHAIN_ID + 1, 20)

  const results = await chain.sendRawTransactions([...raws, foreign])
  t.equal(results.length, 21)
  const hashes = results.slice(0, 20).map((r) => ('hash' in r ? r.hash : null))
  t.ok(
    hashes.every((h) => typeof h === 'string'),
    'each transaction answered with its hash',
  )
  t.ok('error' in results[20]!, 'the refused one answered with its error')

  const receipts = (await Promise.all(hashes.map((h) => chain.request({ method: 'eth_getTransactionReceipt', params: [h] })))) as { status: Hex; blockNumber: Hex }[]
  t.ok(
    receipts.every((r) => r?.status === '0x1'),
    'every transaction mined',
  )
  const latest = Number(await chain.request({ method: 'eth_blockNumber' }))
  const blocks = await blocksOf(chain, latest)

  // What a SIGKILL leaves: the chain's identity and its journal, no snapshot.
  copyJournals(dir, copy)
  const replayed = await open(copy)
  t.teardown(() => replayed.close())
  t.ok(replayed.stats().replayed >= 21, `journal entries replayed: ${replayed.stats().replayed}`)
  t.same(await blocksOf(replayed, latest), blocks, 'same block hashes')
  const balance = (await replayed.request({ method: 'eth_getBalance', params: [recipient(19), 'latest'] })) as Hex
  t.equal(BigInt(balance), 20n)
})

t.test('a transaction waiting behind a nonce gap survives a replay and the snapshot after it', async (t) => {
  const { dir, copy } = dirs(t)
  const { recipient, tx } = transfers(2, 'bb')
  const balance = async (c: Devnet, nonce: number): Promise<bigint> => BigInt((await c.request({ method: 'eth_getBalance', params: [recipient(nonce), 'latest'] })) as Hex)

  const chain = await open(dir)
  const sent = await chain.sendRawTransactions(await Promise.all([0, 1, 2].map(tx)))
  await Promise.all(sent.map((r) => chain.request({ method: 'eth_getTransactionReceipt', params: ['hash' in r ? r.hash : '0x'] })))
  // nonce 3 is missing: nonce 4 waits in the pool
  const waiting = (await chain.request({ method: 'eth_sendRawTransaction', params: [await tx(4)] })) as Hex
  await chain.request({ method: 'evm_mine' }) // a block after it, which it is not in
  copyJournals(dir, copy)
  await chain.close()

  // replayed from the journal (as after a SIGKILL), then closed: the snapshot holds no pool,
  // so the waiting transaction must be carried into the next journal
  const replayed = await open(copy)
  t.equal(await balance(replayed, 2), 3n, 'the mined run is back')
  await replayed.close()
  const reopened = await open(copy)
  t.teardown(() => reopened.close())
  t.equal(await balance(reopened, 4), 0n, 'still waiting for nonce 3')
  await reopened.request({ method: 'eth_sendRawTransaction', params: [await tx(3)] })
  const receipt = (await reopened.request({ method: 'eth_getTransactionReceipt', params: [waiting] })) as { status: Hex } | null
  t.equal(receipt?.status, '0x1', 'the waiting transaction is mined once the gap is filled')
  t.equal(await balance(reopened, 4), 5n)
})

t.test('sends go on while anvil dumps a snapshot; a restart from that snapshot has them, in the same blocks', async (t) => {
  const { dir, copy } = dirs(t)
  const { recipient, tx } = transfers(3, 'cc')
  const mined = (c: Devnet, hashes: string[]): Promise<{ status: Hex; blockHash: Hex }[]> =>
    Promise.all(hashes.map((h) => c.request({ method: 'eth_getTransactionReceipt', params: [h] }))) as Promise<{ status: Hex; blockHash: Hex }[]>
  const hashesOf = (rs: Awaited<ReturnType<Devnet['sendRawTransactions']>>): string[] => rs.map((r) => ('hash' in r ? r.hash : 'refused'))

  const chain = await open(dir)
  // kept blocks with txs in them make the dump take a while
  const before = hashesOf(await chain.sendRawTransactions(await Promise.all(Array.from({ length: 300 }, (_, i) => tx(i)))))
  await mined(chain, before)
  const during = await Promise.all(Array.from({ length: 20 }, (_, i) => tx(300 + i)))

  const snapshot = chain.snapshot()
  while (!chain.stats().dumping) await new Promise((r) => setImmediate(r))
  // called while the dump runs: answered beside it, not queued behind it
  const sent = hashesOf(await chain.sendRawTransactions(during))
  await snapshot
  t.equal(chain.stats().sentBesideDumps, 1, 'the send went beside the dump')
  t.notOk(sent.includes('refused'), 'every send answered with its hash')
  const receipts = await mined(chain, sent)
  t.ok(
    receipts.every((r) => r?.status === '0x1'),
    'the sends made during the dump are mined',
  )

  // What a SIGKILL leaves after that snapshot: the chain's identity, the snapshot, the journal after it.
  const gen = chain.stats().generation
  mkdirSync(copy, { recursive: true })
  for (const f of ['chain.json', `journal-${gen}.ndjson`]) copyFileSync(join(dir, f), join(copy, f))
  cpSync(join(dir, `snap-${gen}`), join(copy, `snap-${gen}`), { recursive: true })
  await chain.close()
  const restarted = await open(copy)
  t.teardown(() => restarted.close())
  t.equal(restarted.stats().generation, gen, 'started from the snapshot taken during the sends')
  t.same(
    (await mined(restarted, sent)).map((r) => r?.blockHash),
    receipts.map((r) => r.blockHash),
    'the same txs in the same blocks',
  )
  t.equal(BigInt((await restarted.request({ method: 'eth_getBalance', params: [recipient(319), 'latest'] })) as Hex), 320n)
})

t.test('a long send is mined in blocks of at most FULL_BLOCK_TXS; a replay has the same blocks', async (t) => {
  const { dir, copy } = dirs(t)
  const { tx } = transfers(4, 'dd')
  const chain = await open(dir)
  t.teardown(() => chain.close())
  const count = 2 * FULL_BLOCK_TXS + 44
  const sent = await chain.sendRawTransactions(await Promise.all(Array.from({ length: count }, (_, i) => tx(i))))
  t.equal(sent.filter((r) => 'hash' in r).length, count, 'every transaction answered with its hash')
  const receipts = (await Promise.all(sent.map((r) => chain.request({ method: 'eth_getTransactionReceipt', params: ['hash' in r ? r.hash : '0x'] })))) as { status: Hex; blockNumber: Hex }[]
  t.ok(
    receipts.every((r) => r?.status === '0x1'),
    'every transaction mined',
  )
  const perBlock = new Map<string, number>()
  for (const r of receipts) perBlock.set(r.blockNumber, (perBlock.get(r.blockNumber) ?? 0) + 1)
  t.ok(perBlock.size >= 3, `mined in ${perBlock.size} blocks`)
  t.ok(
    [...perBlock.values()].every((n) => n <= FULL_BLOCK_TXS),
    `no block holds more than ${FULL_BLOCK_TXS} of them (${[...perBlock.values()].join(', ')})`,
  )

  const latest = Number(await chain.request({ method: 'eth_blockNumber' }))
  const blocks = await blocksOf(chain, latest)
  copyJournals(dir, copy)
  const replayed = await open(copy)
  t.teardown(() => replayed.close())
  t.same(await blocksOf(replayed, latest), blocks, 'same block hashes after a replay of the journal')
})
