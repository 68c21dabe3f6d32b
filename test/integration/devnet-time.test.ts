/**
 * The embedded chain's time for reads: anvil runs a call against the newest block, whose
 * timestamp stops while the chain is idle. A read at latest/pending mines an empty block first
 * when that block is stale (journalled like any block), and no block is mined while nothing asks.
 */
import t, { type Test } from 'tap'
import { copyFileSync, mkdirSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import type { Hex } from 'viem'
import { startDevnet, type Devnet } from '../../src/chain/devnet/index.js'
import { testDir } from '../helpers/gateway.js'

const CHAIN_ID = 31337
/** Creation code that returns block.timestamp: TIMESTAMP PUSH0 MSTORE PUSH1 32 PUSH0 RETURN. */
const TIMESTAMP_CODE = '0x425f5260205ff3'
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))
const nowS = (): number => Math.floor(Date.now() / 1000)

/** A chain's data dir and one for a copy of its files, removed after the test. */
const dirs = (t: Test): { dir: string; copy: string } => ({ dir: testDir(t, 'paygate-devnet-time-'), copy: testDir(t, 'paygate-devnet-time-copy-') })
/** A fresh block is one at most 1 s (of chain time) old: short, so the test need not idle long. */
const open = (dataDir: string): Promise<Devnet> => startDevnet({ dataDir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, idleSnapshotMs: 600_000, freshBlockMs: 1000 })
const blockNumber = async (c: Devnet): Promise<number> => Number(await c.request({ method: 'eth_blockNumber' }))
const callTimestamp = async (c: Devnet, tag?: string): Promise<number> => Number(await c.request({ method: 'eth_call', params: tag ? [{ data: TIMESTAMP_CODE }, tag] : [{ data: TIMESTAMP_CODE }] }))

t.test('after an idle spell a call sees the current time; idle costs no blocks; concurrent reads share one block; a replay gives the same chain', async (t) => {
  const { dir, copy } = dirs(t)
  const chain = await open(dir)
  t.teardown(() => chain.close())
  await chain.request({ method: 'evm_mine' })
  const before = await blockNumber(chain)

  await sleep(2600)
  t.equal(await blockNumber(chain), before, 'no block mined while nothing asks')
  const ts = await callTimestamp(chain) // no block tag: latest
  t.ok(ts >= nowS() - 1, `eth_call sees block.timestamp ${ts}, wall clock ${nowS()}`)
  t.equal(await blockNumber(chain), before + 1, 'one empty block brought the chain up to date')
  const newest = (await chain.request({ method: 'eth_getBlockByNumber', params: ['latest', false] })) as { timestamp: Hex; transactions: string[] }
  t.same([Number(newest.timestamp), newest.transactions], [ts, []])

  // Concurrent reads of every kind after another idle spell: one block between them.
  await sleep(2600)
  const mid = await blockNumber(chain)
  const reads = await Promise.all([
    callTimestamp(chain, 'latest'),
    callTimestamp(chain, 'pending'),
    callTimestamp(chain),
    chain.request({ method: 'eth_estimateGas', params: [{ data: TIMESTAMP_CODE }] }),
    chain.request({ method: 'eth_getBlockByNumber', params: ['latest', false] }).then((b) => Number((b as { timestamp: Hex }).timestamp)),
  ])
  t.equal(await blockNumber(chain), mid + 1, 'concurrent reads shared one block')
  t.ok((reads[0] as number) >= nowS() - 1 && (reads[4] as number) >= nowS() - 1, 'each saw the current time')
  // A read at a given block is not about the current time: nothing mined.
  await sleep(1600)
  await chain.request({ method: 'eth_call', params: [{ data: TIMESTAMP_CODE }, `0x${mid.toString(16)}`] })
  t.equal(await blockNumber(chain), mid + 1, 'a read at an older block mines nothing')

  // Chain time moved ahead without a block (evm_increaseTime): a call sees the moved time.
  await chain.request({ method: 'evm_increaseTime', params: [600] })
  await sleep(1100) // at most one such block per freshBlockMs
  const ahead = await callTimestamp(chain)
  t.ok(ahead >= nowS() + 598, `a call after evm_increaseTime(600) sees ${ahead - nowS()} s ahead`)

  // The blocks mined for chain time are journalled: a chain rebuilt from the journal alone is the same.
  const latest = await blockNumber(chain)
  const hashes = async (c: Devnet): Promise<string[]> =>
    Promise.all(Array.from({ length: latest }, async (_, i) => ((await c.request({ method: 'eth_getBlockByNumber', params: [`0x${(i + 1).toString(16)}`, false] })) as { hash: string }).hash))
  const blocks = await hashes(chain)
  mkdirSync(copy, { recursive: true })
  for (const f of readdirSync(dir)) if (f === 'chain.json' || /^journal-\d+\.ndjson$/.test(f)) copyFileSync(join(dir, f), join(copy, f))
  const replayed = await open(copy)
  t.teardown(() => replayed.close())
  t.same(await hashes(replayed), blocks, 'same block hashes after a replay')
})

t.test('a tail of blocks mined only for chain time is not worth a snapshot at close', async (t) => {
  const { dir } = dirs(t)
  const chain = await open(dir)
  await chain.request({ method: 'evm_mine' })
  await chain.close() // the tail held a block: snapshotted
  const snapshots = (): string[] => readdirSync(dir).filter((f) => /^snap-\d+$/.test(f))
  const snapped = snapshots()
  t.equal(snapped.length, 1)

  const again = await open(dir)
  await sleep(2100)
  t.ok((await callTimestamp(again)) >= nowS() - 1)
  const n = await blockNumber(again)
  await again.close()
  t.same(snapshots(), snapped, 'no new snapshot at close')
  const third = await open(dir)
  t.teardown(() => third.close())
  t.equal(await blockNumber(third), n, 'the block came back from the journal')
})

t.test('a next-block timestamp the caller set is not taken by a block for chain time', async (t) => {
  const { dir } = dirs(t)
  const chain = await open(dir)
  t.teardown(() => chain.close())
  await sleep(2100)
  const before = await blockNumber(chain)
  const at = nowS() + 100
  await chain.request({ method: 'evm_setNextBlockTimestamp', params: [at] })
  await chain.request({ method: 'eth_estimateGas', params: [{ data: TIMESTAMP_CODE }] }) // as viem does before a send
  t.equal(await blockNumber(chain), before, 'no block mined for chain time')
  await chain.request({ method: 'evm_mine' })
  const b = (await chain.request({ method: 'eth_getBlockByNumber', params: ['latest', false] })) as { timestamp: Hex }
  t.equal(Number(b.timestamp), at, 'the next block has the timestamp set')
})

t.test('blocks a caller mined at once (anvil_mine) replay with the timestamps anvil gave each, where it crossed a second too', async (t) => {
  const { dir, copy } = dirs(t)
  const chain = await open(dir)
  const times = async (c: Devnet, from: number, to: number): Promise<number[]> =>
    Promise.all(
      Array.from({ length: to - from + 1 }, async (_, i) =>
        Number(((await c.request({ method: 'eth_getBlockByNumber', params: [`0x${(from + i).toString(16)}`, false] })) as { timestamp: Hex }).timestamp),
      ),
    )
  // anvil times each block after the first by the wall clock: started just before a second
  // ends, the run's blocks straddle it (and a replay, started at another point of a second, would
  // cross it at another block, or not at all)
  let crossed = false
  for (let tries = 0; tries < 5 && !crossed; tries++) {
    await sleep(1000 - (Date.now() % 1000) + 970)
    const from = (await blockNumber(chain)) + 1
    await chain.request({ method: 'anvil_mine', params: ['0x3e8'] }) // 1000 blocks
    crossed = new Set(await times(chain, from, from + 999)).size > 1
  }
  t.ok(crossed, "an anvil_mine's blocks straddled a second")
  const latest = await blockNumber(chain)
  const hashes = async (c: Devnet): Promise<string[]> =>
    Promise.all(Array.from({ length: latest }, async (_, i) => ((await c.request({ method: 'eth_getBlockByNumber', params: [`0x${(i + 1).toString(16)}`, false] })) as { hash: string }).hash))
  const blocks = await hashes(chain)
  const ts = await times(chain, 1, latest)
  mkdirSync(copy, { recursive: true })
  for (const f of readdirSync(dir)) if (f === 'chain.json' || /^journal-\d+\.ndjson$/.test(f)) copyFileSync(join(dir, f), join(copy, f))
  await chain.close()
  const replayed = await open(copy)
  t.teardown(() => replayed.close())
  t.same(await times(replayed, 1, latest), ts, 'the same timestamps after a replay')
  t.same(await hashes(replayed), blocks, 'the same block hashes')
})
