import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { treeView } from '../src/ledger/trees.js'
import { Transactions, type TxRecord } from '../src/ledger/transactions.js'
import { Store } from '../src/store/index.js'
import { fmt, timeAlternating } from './lib.js'

/**
 * `tree`: read a 1,000-node cost tree (an invocation root, 10 sub-agent nodes under it, 99
 * payments under each, one level more under some) through the parent index, from a leaf, vs
 * reading the same 1,000 records by id in one `getMany` (the floor: the records alone, no
 * index walk). Real LevelDB in a temp dir; bounded in count and time.
 */
export async function benchTree(opts: { nodes: number; reads: number; maxMs: number }): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'paygate-bench-tree-'))
  const store = await Store.open(dir)
  try {
    const txs = new Transactions(store)
    const hash = (i: number): string => `0x${i.toString(16).padStart(64, '0')}`
    const records: TxRecord[] = []
    const at = Date.now()
    const base = (i: number, parent: number | null, depth: number): TxRecord => ({
      ...{ id: `tx_${at.toString(36).padStart(9, '0')}${i.toString().padStart(10, '0')}`, agentId: `agent${i % 10}`, status: 'paid', createdAt: at, updatedAt: at },
      ...{ endpoint: 'http://127.0.0.1:1/paid', method: 'GET', protocol: 'x402', amount: '10000', txHash: hash(i + 1), parentTxHash: parent === null ? null : hash(parent + 1), depth },
    })
    records.push({ ...base(0, null, 0), kind: 'invocation', status: 'closed', protocol: null, endpoint: '', amount: '0' })
    // Breadth: 10 under the root, then the rest spread under those, then under the first of those.
    for (let i = 1; i < opts.nodes; i++) {
      const parent = i <= 10 ? 0 : i <= 500 ? 1 + (i % 10) : 11 + (i % 490)
      records.push(base(i, parent, records[parent]!.depth + 1))
    }
    for (let i = 0; i < records.length; i += 200) await store.batch(records.slice(i, i + 200).flatMap((r) => txs.ops(r)))
    await store.settled()
    const leaf = records[records.length - 1]!
    const ids = records.map((r) => r.id)
    let seen = 0
    const [tree, floor] = await timeAlternating(
      opts.reads,
      opts.maxMs,
      async () => {
        const { body } = await treeView(txs, leaf)
        seen = (body.txCount as number) + 1
      },
      async () => {
        await txs.getMany(ids)
      },
    )
    if (seen !== opts.nodes) throw new Error(`the tree read ${seen} nodes, not ${opts.nodes}`)
    console.log(`  tree of ${opts.nodes} nodes from a leaf: p50 ${fmt(tree.p50)} ms, p99 ${fmt(tree.p99)} ms (${tree.n} reads)`)
    console.log(`  the same records by id (getMany): p50 ${fmt(floor.p50)} ms; tree / floor = ${fmt(tree.p50 / floor.p50)}x`)
  } finally {
    await store.close()
    rmSync(dir, { recursive: true, force: true })
  }
}
