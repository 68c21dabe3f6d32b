/**
 * The rules a chain runs under are its data dir's for good: a new chain runs Cancun (Prague's
 * EIP-2935 ring made every block and dump cost more as blocks piled up), and a data dir made
 * under Prague keeps Prague, so its restart replays its journal under the rules it was mined with.
 */
import t from 'tap'
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { startDevnet, type Devnet } from '../../src/chain/devnet/index.js'
import { NEW_CHAIN_HARDFORK } from '../../src/chain/devnet/data-dir.js'
import { testDir } from '../helpers/gateway.js'

const CHAIN_ID = 31337
const open = (dataDir: string): Promise<Devnet> => startDevnet({ dataDir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, idleSnapshotMs: 600_000 })
const hardfork = async (c: Devnet): Promise<string> => String(((await c.request({ method: 'anvil_nodeInfo' })) as { hardFork: string }).hardFork).toLowerCase()
const newestHeader = async (c: Devnet): Promise<Record<string, unknown>> => {
  await c.request({ method: 'evm_mine' })
  return (await c.request({ method: 'eth_getBlockByNumber', params: ['latest', false] })) as Record<string, unknown>
}

t.test('a new chain records and runs Cancun, and keeps it across a restart', async (t) => {
  const dir = testDir(t, 'paygate-devnet-hardfork-')
  t.equal(NEW_CHAIN_HARDFORK, 'cancun')
  let chain = await open(dir)
  t.equal((JSON.parse(readFileSync(join(dir, 'chain.json'), 'utf8')) as { hardfork: string }).hardfork, 'cancun', 'chain.json says cancun')
  t.equal(await hardfork(chain), 'cancun', 'anvil runs cancun')
  const h = await newestHeader(chain)
  t.ok('parentBeaconBlockRoot' in h, 'a Cancun header (EIP-4788 root)')
  t.notOk('requestsHash' in h, 'and not a Prague one')
  await chain.close()
  chain = await open(dir)
  t.teardown(() => chain.close())
  t.equal(await hardfork(chain), 'cancun', 'still cancun after a restart')
})

t.test('a data dir made under Prague keeps Prague', async (t) => {
  const dir = testDir(t, 'paygate-devnet-hardfork-old-')
  // what an earlier version wrote for a new chain
  writeFileSync(join(dir, 'chain.json'), JSON.stringify({ format: 1, engine: 'anvil', chainId: CHAIN_ID, genesisTime: Math.floor(Date.now() / 1000) - 60, hardfork: 'prague' }))
  const chain = await open(dir)
  t.teardown(() => chain.close())
  t.equal(await hardfork(chain), 'prague', 'anvil runs prague')
  t.ok('requestsHash' in (await newestHeader(chain)), 'a Prague header (EIP-7685 requests hash)')
})
