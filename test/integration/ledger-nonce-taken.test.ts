import t from 'tap'
import type { Hex } from 'viem'
import { recordIdOf } from '../../src/chain/ledger-tx.js'
import { recordedEvents } from '../../src/chain/ledger-verify.js'
import { OffsetClock } from '../../src/util/clock.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * Someone sends a transaction from the ledger signer's key, taking the nonce the gateway's next
 * ledger record was given. That record can never be mined, and every later one stayed
 * unconfirmed behind it for good; now it is recorded again under a new nonce once it has waited
 * the resend interval (60 s, on the gateway's clock) and the chain shows its nonce used.
 */
for (const signedLedger of [false, true]) {
  t.test(
    `a ledger record whose nonce another transaction took is recorded again, and the records behind it are confirmed (${signedLedger ? 'signed, as an external chain gets them' : 'unsigned, the embedded default'})`,
    async (t) => {
      const clock = new OffsetClock()
      const gw = await startTestGateway({ clock, options: { signedLedger } })
      t.teardown(() => gw.close())
      const { info, pub, merchantOptions } = await testChain(gw)
      const m = await startV2Merchant(await merchantOptions(10_000n))
      t.teardown(() => m.close())
      await gw.api('POST', '/v1/agents', { body: { agentId: 'payer' } })
      await gw.api('POST', '/v1/wallets', { body: { agentId: 'payer' } })
      const pay = async (parentTxHash?: Hex): Promise<{ id: string; txHash: Hex }> => {
        const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${m.url}/paid`, method: 'GET', ...(parentTxHash ? { parentTxHash } : {}) } })
        if (r.status !== 200) throw new Error(`pay: ${r.status} ${r.text}`)
        return { id: r.body.transactionId, txHash: r.body.txHash }
      }
      const txOf = async (id: string) => (await gw.api('GET', `/v1/transactions/${id}`)).body
      const until = async (what: string, ok: () => Promise<boolean>, ms = 15_000): Promise<void> => {
        const end = Date.now() + ms
        while (!(await ok())) {
          if (Date.now() > end) throw new Error(`timed out waiting: ${what}`)
          await new Promise((r) => setTimeout(r, 50))
        }
      }

      await pay()
      t.ok(await gw.gw.outbox.drain(15_000), 'the first record is confirmed')
      const chain = gw.gw.chain
      const signer = chain.signer.address
      const nonce = await pub.getTransactionCount({ address: signer, blockTag: 'pending' })
      // Another transaction from the signer's account (the embedded chain takes it impersonated).
      await pub.request({ method: 'anvil_impersonateAccount' as never, params: [signer] as never })
      const foreign = (await pub.request({ method: 'eth_sendTransaction' as never, params: [{ from: signer, to: signer, value: '0x0', nonce: `0x${nonce.toString(16)}` }] as never })) as Hex
      await pub.waitForTransactionReceipt({ hash: foreign, pollingInterval: 20 })

      const taken = await pay()
      const behind = await pay(taken.txHash) // hung under the taken record's first hash
      // The second one is mined (its nonce follows the foreign one's), the first never can be.
      await until('the record behind it is mined', async () => (await pub.getTransactionReceipt({ hash: behind.txHash }).catch(() => null)) !== null)
      await new Promise((r) => setTimeout(r, 500)) // a few outbox passes
      t.equal((await txOf(behind.id)).ledger.status, 'queued', 'before the wait: the mined record behind it still waits (records confirm in nonce order)')
      t.equal((await txOf(taken.id)).ledger.status, 'queued', 'and the one whose nonce was taken')
      t.equal(await pub.getTransactionReceipt({ hash: taken.txHash }).catch(() => null), null, 'which has no receipt')

      clock.offset += 61_000
      t.ok(await gw.gw.outbox.drain(15_000), 'after the resend interval every record is confirmed')
      const after = await txOf(taken.id)
      t.not(after.txHash, taken.txHash, 'the payment was recorded again, under a new ledger hash')
      t.match(after.ledger, { status: 'confirmed', replacedTxHash: taken.txHash }, 'confirmed, naming the hash it replaced')
      const receipt = await pub.getTransactionReceipt({ hash: after.txHash })
      t.equal(receipt.status, 'success', 'the new record is on chain')
      t.equal(receipt.from.toLowerCase(), signer.toLowerCase(), "from the ledger signer's account")
      const events = recordedEvents(receipt.logs, info.ledger)
      t.equal(events.length, 1)
      t.equal(events[0]?.entry.id, recordIdOf(taken.id), "it records this payment's id")
      t.equal(events[0]?.entry.amount, 10_000n, 'and its amount')
      t.match(await txOf(behind.id), { txHash: behind.txHash, ledger: { status: 'confirmed' } }, 'the record behind it is confirmed under its own hash')
      t.equal((await txOf(taken.txHash)).id, taken.id, 'the first hash still finds the payment')
      const tree = (await gw.api('GET', `/v1/transactions/${taken.id}/tree`)).body
      t.match(tree, { root: { txHash: after.txHash, children: [{ txHash: behind.txHash }] }, txCount: 1 }, 'its tree still holds the payment hung under its first hash')
      t.ok(
        gw.logs.some((l) => l.includes("took a ledger record's nonce")),
        'a warning says what happened',
      )
    },
  )
}
