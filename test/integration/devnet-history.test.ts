/**
 * The embedded chain keeps only its newest blocks' txs in anvil (keepBlocks): receipts of
 * older blocks come from the receipt archive, also after a restart and after a rebuild from
 * the journal alone (as after a SIGKILL). The PaymentLedger (version 2) keeps two storage
 * slots; every record stays verifiable: the events, folded in order, give the contract's head.
 */
import t from 'tap'
import { copyFileSync, cpSync, mkdirSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import { encodeFunctionData, type Hex, keccak256, toHex } from 'viem'
import { mnemonicToAccount } from 'viem/accounts'
import { bytecodes, paymentLedgerAbi } from '../../src/chain/contracts/abis.js'
import { DEVNET_MNEMONIC, startDevnet, type Devnet } from '../../src/chain/devnet/index.js'
import { encodeRecordCall } from '../../src/chain/ledger-call.js'
import type { LedgerEntry } from '../../src/chain/ledger-tx.js'
import { headAfter, type RecordedEvent, recordedEvents } from '../../src/chain/ledger-verify.js'
import { testDir } from '../helpers/gateway.js'

const CHAIN_ID = 31337
const KEEP = 2
const open = (dataDir: string): Promise<Devnet> => startDevnet({ dataDir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, idleSnapshotMs: 600_000, keepBlocks: KEEP })
const from = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 1 })

type Receipt = { status: Hex; blockNumber: Hex; contractAddress?: Hex; logs: { address: string; topics: Hex[]; data: Hex }[] }
const receiptOf = async (c: Devnet, hash: Hex): Promise<Receipt | null> => (await c.request({ method: 'eth_getTransactionReceipt', params: [hash] })) as Receipt | null

const entry = (i: number): LedgerEntry => ({
  id: keccak256(toHex(`payment-${i}`)),
  parentTxHash: i % 2 ? keccak256(toHex(`parent-${i}`)) : `0x${'0'.repeat(64)}`,
  agentId: `agent-${i % 3}`,
  amount: BigInt(1000 + i),
  protocol: i % 2 ? 'x402' : '',
  origin: i % 2 ? `https://m${i}.example:8443` : '',
  pathHash: keccak256(toHex(`/p/${i}`)),
  depth: i % 3,
})

t.test('receipts of blocks anvil forgot come from the archive; the events give the ledger head', async (t) => {
  const dir = testDir(t, 'paygate-devnet-history-')
  const chain = await open(dir)
  let nonce = 0
  const sign = (o: { to?: Hex; data: Hex; gas: bigint }): Promise<Hex> =>
    from.signTransaction({ chainId: CHAIN_ID, type: 'eip1559', nonce: nonce++, ...o, maxFeePerGas: 10n ** 11n, maxPriorityFeePerGas: 1n })
  const deploy = (await chain.request({ method: 'eth_sendRawTransaction', params: [await sign({ data: bytecodes.PaymentLedger, gas: 3_000_000n })] })) as Hex
  const ledger = (await receiptOf(chain, deploy))!.contractAddress!

  // one record per block, many more blocks than anvil keeps
  const hashes: Hex[] = []
  for (let i = 0; i < 3 * KEEP + 2; i++) {
    const [r] = await chain.sendRawTransactions([await sign({ to: ledger, data: `0x${encodeRecordCall(entry(i)).toString('hex')}`, gas: 300_000n })])
    hashes.push((r as { hash: Hex }).hash)
    t.equal((await receiptOf(chain, hashes[i]!))?.status, '0x1', `record ${i} mined`)
  }
  const head = async (c: Devnet): Promise<Hex> =>
    (await c.request({ method: 'eth_call', params: [{ to: ledger, data: encodeFunctionData({ abi: paymentLedgerAbi, functionName: 'head' }) }, 'latest'] })) as Hex
  const events = async (c: Devnet): Promise<RecordedEvent[]> => {
    const out: RecordedEvent[] = []
    for (const h of hashes) {
      const r = await receiptOf(c, h)
      t.ok(r, `receipt of ${h}`)
      const evs = recordedEvents(r?.logs ?? [], ledger)
      t.equal(evs.length, 1)
      out.push(...evs)
    }
    return out
  }
  const evs = await events(chain)
  t.same(
    evs.map((e) => e.entry),
    hashes.map((_, i) => entry(i)),
    'every event holds its record, the oldest ones too',
  )
  const onChain = await head(chain)
  t.not(onChain, `0x${'0'.repeat(64)}`)
  t.equal(headAfter(evs), onChain, "the events, in order, give the contract's head")
  t.not(headAfter(evs.slice(1)), onChain, 'a missing record does not')
  const tampered = evs.map((e, i) => (i === 2 ? { ...e, entry: { ...e.entry, amount: e.entry.amount + 1n } } : e))
  t.not(headAfter(tampered), onChain, 'a changed amount does not')
  const oldest = await chain.request({ method: 'eth_getTransactionByHash', params: [hashes[0]] })
  t.equal(oldest, null, 'anvil itself forgot the oldest tx (the archive is what answers its receipt)')
  // a block's receipts after anvil forgot its txs: from the archive, as its receipt is
  const oldBlock = (await receiptOf(chain, hashes[0]!))!.blockNumber
  t.same(await chain.request({ method: 'eth_getBlockReceipts', params: [oldBlock] }), [await receiptOf(chain, hashes[0]!)], "a forgotten block's receipts come from the archive")

  // what a SIGKILL leaves (chain identity, journal, receipt archive; no snapshot), and a clean restart
  const copy = testDir(t, 'paygate-devnet-history-copy-')
  mkdirSync(copy, { recursive: true })
  for (const f of readdirSync(dir)) if (f === 'chain.json' || /^journal-\d+\.ndjson$/.test(f)) copyFileSync(join(dir, f), join(copy, f))
  cpSync(join(dir, 'receipts'), join(copy, 'receipts'), { recursive: true })
  await chain.close()
  const restarted = await open(dir)
  t.teardown(() => restarted.close())
  t.equal(headAfter(await events(restarted)), await head(restarted), 'after a restart')
  const replayed = await open(copy)
  t.teardown(() => replayed.close())
  t.equal(await head(replayed), onChain, 'the journal rebuilds the same head')
  t.equal(headAfter(await events(replayed)), onChain, 'and every receipt is there')
})
