import t from 'tap'
import type { Transactions, TxRecord, TxStatus } from '../../src/ledger/transactions.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * The reconciler lists the open records first and settles them after. A payment under way when
 * the list is read can finish before its turn comes: settled from the listed (older) state, it
 * was recorded a second time (a second ledger record, metrics and spend counted twice). Each
 * record is read again once no payment holds it, and only an open one is settled.
 */
const gw = await startTestGateway({ env: { PAYGATE_CHAIN_CHAIN_ID: '84532' } })
t.teardown(() => gw.close())
const { merchantOptions } = await testChain(gw)
const PRICE = 10_000n

t.test('a payment that finishes between the listing and the settling is recorded once', async (t) => {
  // The merchant settles on chain, then holds its answer: the record is open, its authorization used.
  const m = await startV2Merchant({ ...(await merchantOptions(PRICE)), faults: { hangOnceMs: 1_500 } })
  t.teardown(() => m.close())
  await gw.api('POST', '/v1/agents', { body: { agentId: 'racer' } })
  await gw.api('POST', '/v1/wallets', { body: { agentId: 'racer' } })
  await gw.api('PUT', '/v1/policies/racer', { body: { dailyBudget: { usdc: 1 } } })

  // The reconciler's listing (its own passes too) waits at its end until the payment is answered.
  const txs = gw.gw.transactions as Transactions & { all(status: TxStatus): AsyncIterable<TxRecord> }
  const all = txs.all.bind(txs)
  let open = () => {}
  const answered = new Promise<void>((r) => (open = r))
  const listed: string[] = []
  txs.all = async function* (status: TxStatus) {
    for await (const r of all(status)) {
      if (r.agentId === 'racer') listed.push(`${r.id}:${r.status}`)
      yield r
    }
    if (status === 'unknown') await answered
  }
  t.teardown(() => {
    txs.all = all
  })

  const paying = gw.api('POST', '/v1/pay', { body: { agentId: 'racer', endpoint: `${m.url}/paid`, method: 'GET' } })
  while (m.stats.settlements < 1) await new Promise((r) => setTimeout(r, 10))
  const pass = gw.gw.reconciler.runOnce()
  while (!listed.length) await new Promise((r) => setTimeout(r, 5))
  const r = await paying
  open()
  await pass

  t.equal(r.status, 200, r.text)
  const id = listed[0]!.split(':')[0]!
  t.match(listed[0], /:pending$/, 'the reconciler listed the payment while it was under way')
  const rec = (await gw.api('GET', `/v1/transactions/${id}`)).body
  t.equal(rec.status, 'paid')
  t.equal(rec.txHash, r.body.txHash, 'the record keeps the ledger record the payment answered with')
  t.notOk(
    gw.logs.some((l) => l.includes('reconciled: the authorization was used on chain')),
    'the reconciler did not settle it',
  )
  const metrics = (await gw.api('GET', '/v1/agents/racer/metrics?metrics=tx_count,spend&window=1h')).body.metrics
  t.same(metrics, { tx_count: 1, spend: { total: 0.01 } }, 'counted once')
  t.equal((await gw.api('GET', '/v1/policies/racer')).body.dailyBudget.usedToday, 0.01)
  t.equal(m.stats.settlements, 1)
})
