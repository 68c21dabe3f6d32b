/**
 * The embedded chain on its own thread (startDevnetThread, as the gateway runs it): the same
 * handle as in process, with answers, JSON-RPC errors (code and all), a start that fails on a
 * taken port, stats and close carried across the thread.
 */
import t from 'tap'
import { rmSync } from 'node:fs'
import { privateKeyToAccount } from 'viem/accounts'
import { startDevnetThread } from '../../src/chain/devnet/thread.js'
import { tempDir } from '../helpers/gateway.js'

// anvil's first dev account (DEVNET_MNEMONIC), funded at genesis
const KEY = '0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80'
const account = privateKeyToAccount(KEY)

t.test('answers, errors with their codes, sends, stats and close, across the thread', async (t) => {
  const dir = tempDir('paygate-devnet-thread-')
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const logs: string[] = []
  const chain = await startDevnetThread({ dataDir: dir, chainId: 31337, host: '127.0.0.1', port: 0, idleSnapshotMs: 600_000, log: (msg) => logs.push(msg) })
  t.ok(logs.includes('embedded chain ready'), "the thread's log lines reach the caller's log")
  t.equal(await chain.request({ method: 'eth_chainId' }), '0x7a69')
  t.match(chain.rpcUrl, /^http:\/\/127\.0\.0\.1:\d+$/)
  t.ok(chain.childPid > 0 && process.kill(chain.childPid, 0), 'anvil runs')

  const refused = await chain.request({ method: 'anvil_reset' }).catch((e: unknown) => e)
  t.match(refused, { message: /anvil_reset is not available/, code: -32601 }, 'a JSON-RPC error comes back as the in-process one: message and code')

  const blocks = chain.stats().blocks
  const nonce = Number(await chain.request({ method: 'eth_getTransactionCount', params: [account.address, 'pending'] }))
  const raws = await Promise.all(
    [0, 1, 2].map((i) =>
      account.signTransaction({ type: 'eip1559', chainId: 31337, nonce: nonce + i, to: account.address, value: 1n, gas: 21_000n, maxFeePerGas: 50_000_000_000n, maxPriorityFeePerGas: 1n }),
    ),
  )
  const sent = await chain.sendRawTransactions([...raws, '0x00'])
  t.equal(sent.length, 4)
  t.ok(
    sent.slice(0, 3).every((s) => 'hash' in s),
    'three accepted',
  )
  t.match(sent[3], { error: { code: Number } }, 'a bad one refused, with its error')
  const hash = (sent[0] as { hash: `0x${string}` }).hash
  const receipt = (await chain.request({ method: 'eth_getTransactionReceipt', params: [hash] })) as { status: string } | null
  t.equal(receipt?.status, '0x1', 'mined (the receipt waits for its block)')
  await chain.snapshot()
  t.ok(chain.stats().blocks > blocks, `stats follow the chain (${blocks} -> ${chain.stats().blocks} blocks)`)
  t.ok(chain.stats().snapshots >= 1, 'a snapshot was taken')

  // A second chain on the same port: the start fails with the listener's own error code.
  const port = Number(new URL(chain.rpcUrl).port)
  const dir2 = tempDir('paygate-devnet-thread-')
  t.teardown(() => rmSync(dir2, { recursive: true, force: true }))
  await t.rejects(startDevnetThread({ dataDir: dir2, chainId: 31337, host: '127.0.0.1', port }), { code: 'EADDRINUSE' }, 'a taken port fails the start with EADDRINUSE')

  const pid = chain.childPid
  await Promise.all([chain.close(), chain.close()])
  t.throws(() => process.kill(pid, 0), 'anvil stopped with it')
  await t.rejects(chain.request({ method: 'eth_chainId' }), { message: /embedded chain is closed/ }, 'calls after close fail')
})
