/**
 * The embedded chain takes ledger records unsigned (RpcFront.sendLedger): from the account
 * impersonated, with the hash Paygate computes for them; journalled so that a chain rebuilt
 * from the journal alone (as after a SIGKILL) and a trim's reload keep them; a probe that keeps
 * nothing; a caller's impersonation calls do not stop them.
 */
import t, { type Test } from 'tap'
import { copyFileSync, mkdirSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import type { Hex } from 'viem'
import { generatePrivateKey, mnemonicToAccount } from 'viem/accounts'
import { DEVNET_MNEMONIC, startDevnet, type Devnet } from '../../src/chain/devnet/index.js'
import { LedgerSigner } from '../../src/chain/ledger-signer.js'
import { ZERO32 } from '../../src/chain/ledger-tx.js'
import { FastSigner } from '../../src/crypto/secp256k1.js'
import { testDir } from '../helpers/gateway.js'

const CHAIN_ID = 31337
const open = (dataDir: string, trimEveryBlocks?: number): Promise<Devnet> =>
  startDevnet({ dataDir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0, idleSnapshotMs: 600_000, ...(trimEveryBlocks ? { trimEveryBlocks } : {}) })
const hashesOf = (rs: Awaited<ReturnType<Devnet['sendLedger']>>): string[] => rs.map((r) => ('hash' in r ? r.hash : `refused: ${r.error.message}`))
const receipt = (c: Devnet, h: string) => c.request({ method: 'eth_getTransactionReceipt', params: [h] }) as Promise<{ status: Hex; from: Hex; blockHash: Hex } | null>
const count = async (c: Devnet, a: string, tag: string): Promise<number> => Number((await c.request({ method: 'eth_getTransactionCount', params: [a, tag] })) as Hex)

const bank = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 6 })
/**
 * An account of its own (not one of anvil's dev accounts), funded by a transfer (a dev method
 * such as anvil_setBalance would turn trimming off), and its records as unsigned transactions.
 */
async function account(chain: Devnet) {
  const key = new FastSigner(generatePrivateKey())
  const nonce = await count(chain, bank.address, 'pending')
  const fund = await bank.signTransaction({ chainId: CHAIN_ID, type: 'eip1559', nonce, to: key.address, value: 10n ** 20n, gas: 21_000n, maxFeePerGas: 10n ** 11n, maxPriorityFeePerGas: 1n })
  const [sent] = await chain.sendRawTransactions([fund])
  if (!sent || !('hash' in sent) || (await receipt(chain, sent.hash))?.status !== '0x1') throw new Error('funding failed')
  const signer = new LedgerSigner(key)
  const ctx = { chainId: CHAIN_ID, ledger: `0x${'42'.repeat(20)}`, maxFeePerGas: 50_000_000_000n, maxPriorityFeePerGas: 1n }
  const entry = (agentId: string) => ({ id: ZERO32, parentTxHash: ZERO32, agentId, amount: 1n, protocol: 'x402', origin: 'http://merchant.test', pathHash: ZERO32, depth: 0 })
  const record = (nonce: number | bigint) => signer.unsigned(ctx, entry(`agent-${nonce}`), BigInt(nonce))
  const signed = (nonce: number) => signer.sign(ctx, entry(`signed-${nonce}`), BigInt(nonce))
  return { address: key.address, record, signed }
}

t.test('unsigned sends: the hashes computed, mined from the account, and the same chain again from the journal alone', async (t: Test) => {
  const dir = testDir(t, 'paygate-devnet-')
  const chain = await open(dir)
  const { address, record } = await account(chain)

  const probe = record(0)
  t.equal(await chain.probeUnsigned(address, probe.raw), probe.hash, 'the probe: anvil gives the hash computed')
  t.equal(await chain.request({ method: 'eth_getTransactionByHash', params: [probe.hash] }), null, 'the probe left nothing in the pool')
  t.equal(await count(chain, address, 'pending'), 0, 'nor took its nonce')
  const far = record(2n ** 62n)
  await t.rejects(chain.probeUnsigned(address, far.raw), /could not be dropped/, 'a probe the pool cannot drop (not the next nonce) is an error')

  const made = Array.from({ length: 40 }, (_, i) => record(i))
  const hashes = hashesOf(
    await chain.sendLedger(
      address,
      made.map((m) => m.raw),
    ),
  )
  t.same(
    hashes,
    made.map((m) => m.hash),
    'each answered with the hash computed for it',
  )
  const receipts = await Promise.all(hashes.map((h) => receipt(chain, h)))
  t.ok(
    receipts.every((r) => r?.status === '0x1' && r.from.toLowerCase() === address.toLowerCase()),
    'each mined, from the account',
  )
  t.equal(await count(chain, address, 'latest'), 40)

  // What a SIGKILL leaves with no snapshot taken: the chain's identity and its journals.
  const copy = testDir(t, 'paygate-devnet-copy-')
  mkdirSync(copy, { recursive: true })
  for (const f of readdirSync(dir)) if (f === 'chain.json' || /^journal-\d+\.ndjson$/.test(f)) copyFileSync(join(dir, f), join(copy, f))
  const blocks = await chain.request({ method: 'eth_blockNumber' })
  const latest = await chain.request({ method: 'eth_getBlockByNumber', params: ['latest', false] })
  await chain.close()
  const again = await open(copy)
  t.teardown(() => again.close())
  t.equal(await again.request({ method: 'eth_blockNumber' }), blocks)
  t.same(await again.request({ method: 'eth_getBlockByNumber', params: ['latest', false] }), latest, 'the same newest block')
  t.equal((await receipt(again, hashes[39]!))?.status, '0x1')
  // the replay impersonated the account again: it sends on
  const next = record(40)
  t.same(hashesOf(await again.sendLedger(address, [next.raw])), [next.hash], 'sends go on after the restart')
  t.equal((await receipt(again, next.hash))?.status, '0x1')
})

t.test("a caller's impersonation calls do not stop unsigned sends", async (t: Test) => {
  const chain = await open(testDir(t, 'paygate-devnet-'))
  t.teardown(() => chain.close())
  const { address, record } = await account(chain)
  const first = record(0)
  t.same(hashesOf(await chain.sendLedger(address, [first.raw])), [first.hash])
  await chain.request({ method: 'anvil_stopImpersonatingAccount', params: [address] })
  const second = record(1)
  t.same(hashesOf(await chain.sendLedger(address, [second.raw])), [second.hash], 'impersonated again for the next send')
  t.equal((await receipt(chain, second.hash))?.status, '0x1')
})

t.test('an unsigned tx waiting in the pool across a trim is mined after it', async (t: Test) => {
  const chain = await open(testDir(t, 'paygate-devnet-'), 256)
  t.teardown(() => chain.close())
  const { address, record } = await account(chain)
  await chain.request({ method: 'anvil_mine', params: ['0x12c'] }) // 300 blocks
  await chain.request({ method: 'evm_setAutomine', params: [false] })
  const waiting = record(1) // behind a nonce gap
  t.same(hashesOf(await chain.sendLedger(address, [waiting.raw])), [waiting.hash])
  await chain.snapshot()
  t.equal(chain.stats().trims, 1, 'the snapshot trimmed')
  await chain.request({ method: 'evm_setAutomine', params: [true] })
  const gap = record(0)
  t.same(hashesOf(await chain.sendLedger(address, [gap.raw])), [gap.hash])
  t.equal((await receipt(chain, waiting.hash))?.status, '0x1', 'the waiting one mined once the gap is filled')
})

t.test('signed and unsigned records of one account in one call: each run of one kind in turn, in nonce order', async (t: Test) => {
  const chain = await open(testDir(t, 'paygate-devnet-'))
  t.teardown(() => chain.close())
  const { address, record, signed } = await account(chain)
  // records signed before an upgrade still waiting, then unsigned ones, then a signed one again
  const made = [signed(0), signed(1), record(2), record(3), signed(4)]
  t.same(
    hashesOf(
      await chain.sendLedger(
        address,
        made.map((m) => m.raw),
      ),
    ),
    made.map((m) => m.hash),
    'each with its own hash',
  )
  const receipts = await Promise.all(made.map((m) => receipt(chain, m.hash)))
  t.ok(
    receipts.every((r) => r?.status === '0x1' && r.from.toLowerCase() === address.toLowerCase()),
    'each mined, from the account',
  )
  t.equal(await count(chain, address, 'latest'), 5)
})
