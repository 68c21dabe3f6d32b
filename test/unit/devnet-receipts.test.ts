import t, { type Test } from 'tap'
import { ReceiptArchive } from '../../src/chain/devnet/archive.js'
import type { Journal } from '../../src/chain/devnet/journal.js'
import type { Miner } from '../../src/chain/devnet/miner.js'
import type { AnvilNode } from '../../src/chain/devnet/node.js'
import { RpcFront } from '../../src/chain/devnet/rpc.js'
import type { RpcResponse } from '../../src/chain/devnet/types.js'
import { testDir } from '../helpers/gateway.js'

/**
 * The embedded chain's front answers receipts of recently mined blocks from the receipt
 * archive's memory (what anvil gave when the block was mined) without asking anvil again;
 * anything else still goes to anvil, and a tx anvil forgot to the archive's files.
 */
const hashOf = (i: number): string => `0x${'ab'}${i.toString(16).padStart(62, '0')}`
const receipt = (i: number, block: number) => ({ transactionHash: hashOf(i), blockNumber: `0x${block.toString(16)}`, status: '0x1', logs: [{ data: '0x01' }] })

/** A front over an anvil stand-in that records what it is asked and answers `answer(method)`. */
function front(t: Test, answer: (method: string) => unknown) {
  const asked: string[] = []
  const node = {
    closed: false,
    dead: null,
    pending: new Map<string, string>(),
    read: async (method: string): Promise<RpcResponse> => {
      asked.push(method)
      return { jsonrpc: '2.0', id: 1, result: answer(method) }
    },
  } as unknown as AnvilNode
  const archive = new ReceiptArchive(testDir(t), 2)
  t.teardown(() => archive.close())
  const miner = { automine: true, freshenForRead: async () => {} } as unknown as Miner
  const rpc = new RpcFront(node, {} as Journal, miner, archive, 250)
  const call = async (method: string, params: unknown[]): Promise<unknown> => (await rpc.handle({ jsonrpc: '2.0', id: 7, method, params })).result
  return { asked, archive, call }
}

t.test('receipts of a recently mined block come from memory; anvil is not asked again', async (t) => {
  const { asked, archive, call } = front(t, () => null)
  archive.add([receipt(1, 5), receipt(2, 5)])
  t.same(await call('eth_getTransactionReceipt', [hashOf(2)]), receipt(2, 5), 'a tx receipt')
  t.same(await call('eth_getTransactionReceipt', [hashOf(2).toUpperCase().replace('0X', '0x')]), receipt(2, 5), 'any case of the hash')
  t.same(await call('eth_getBlockReceipts', ['0x5']), [receipt(1, 5), receipt(2, 5)], "the block's receipts, in order")
  t.same(asked, [], 'anvil was asked nothing')
})

t.test('what memory does not hold goes to anvil; a tx anvil forgot comes from the files', async (t) => {
  const answers: Record<string, unknown> = { eth_getBlockReceipts: [receipt(9, 8)], eth_getTransactionReceipt: receipt(9, 8) }
  const { asked, archive, call } = front(t, (m) => answers[m] ?? null)
  t.same(await call('eth_getTransactionReceipt', [hashOf(9)]), receipt(9, 8), 'an unknown tx: as anvil answers')
  t.same(await call('eth_getBlockReceipts', ['0x8']), [receipt(9, 8)], 'an unknown block: as anvil answers')
  t.same(await call('eth_getBlockReceipts', ['latest']), [receipt(9, 8)], 'a tag that is not a number: anvil')
  t.same(asked, ['eth_getTransactionReceipt', 'eth_getBlockReceipts', 'eth_getBlockReceipts'])
  // An old tx: out of memory (past the archive's in-memory window), on disk; anvil answers null for it.
  answers.eth_getTransactionReceipt = null
  archive.add([receipt(100, 1)])
  for (let i = 0; i < 4096; i += 64) archive.add(Array.from({ length: 64 }, (_, k) => receipt(1000 + i + k, 2 + (i >> 6))))
  t.same(await call('eth_getTransactionReceipt', [hashOf(100)]), receipt(100, 1), 'from the files, after anvil said null')
  t.equal(asked.at(-1), 'eth_getTransactionReceipt')
  t.equal(await call('eth_getTransactionReceipt', [hashOf(99)]), null, 'a tx no one knows is null')
})
