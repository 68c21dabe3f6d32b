import t, { type Test } from 'tap'
import { type Hex, keccak256, recoverTransactionAddress, type TransactionSerialized } from 'viem'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { madeAhead, madeTogether, watchSigning } from '../helpers/ledger-signing.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * Ledger records signed, as an external chain gets them (`signedLedger`: the embedded chain
 * otherwise takes them unsigned): a lone payment's signed on the main thread while its retry is
 * on the wire, payments made together on the signing thread; each a signed transaction of the
 * ledger signer on chain.
 */
const gw = await startTestGateway({ env: { PAYGATE_CHAIN_CHAIN_ID: '84532' }, options: { signedLedger: true } })
t.teardown(() => gw.close())
const { pub, merchantOptions } = await testChain(gw)
const m = await startV2Merchant(await merchantOptions(10_000n))
t.teardown(() => m.close())
await gw.api('POST', '/v1/agents', { body: { agentId: 'payer' } })
await gw.api('POST', '/v1/wallets', { body: { agentId: 'payer' } })
const pay = () => gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, method: 'GET' } })

/** The record's transaction is signed by the ledger signer, has the stored hash, and succeeded on chain. */
async function signedOnChain(t: Test, hash: Hex, raw: Hex | undefined): Promise<void> {
  if (!raw) return void t.fail(`no transaction made for ${hash}`)
  t.equal(await recoverTransactionAddress({ serializedTransaction: raw as TransactionSerialized }), gw.gw.chain.signer.address, 'signed by the ledger signer')
  t.equal(keccak256(raw), hash, 'its hash is the one stored')
  const receipt = await pub.getTransactionReceipt({ hash })
  t.equal(receipt.status, 'success')
  t.equal(receipt.from.toLowerCase(), gw.gw.chain.signer.address.toLowerCase(), 'the chain took it as from the ledger signer')
}

t.test('a lone payment: its ledger record signed on the main thread while the retry is on the wire', async (t) => {
  const calls = watchSigning(t, gw)
  t.equal(calls.thread, true, 'the gateway has a thread that signs ledger records')
  const r = await pay()
  t.equal(r.status, 200, r.text)
  madeAhead(t, calls, r.body.txHash)
  t.ok(await gw.gw.outbox.drain(10_000), 'the ledger record is confirmed')
  await signedOnChain(t, r.body.txHash, calls.raws.get(r.body.txHash))
})

t.test('payments made together: signed on the signing thread, each its own transaction', async (t) => {
  const calls = watchSigning(t, gw)
  const rs = await Promise.all(Array.from({ length: 12 }, pay))
  for (const r of rs) t.equal(r.status, 200, r.text)
  const hashes = rs.map((r) => r.body.txHash as Hex)
  madeTogether(t, calls, hashes)
  t.ok(await gw.gw.outbox.drain(10_000), 'the ledger records are confirmed')
  for (const h of hashes) await signedOnChain(t, h, calls.raws.get(h))
})
