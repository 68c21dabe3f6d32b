import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { startTestGateway, testChain } from '../helpers/gateway.js'

/**
 * The spec: `payment_protocol_error` when the target answered 402 but the body matches
 * neither the x402 nor the MPP schema. A body in the spec's x402 shape whose fields cannot
 * be read (an amount that is not base units, an address that is not one) is such a body;
 * a readable offer for another chain is not (no_payable_offer). Nothing is signed or kept.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const { info } = await testChain(gw)
await gw.api('POST', '/v1/wallets', { body: { agentId: 'payer' } })

const offers: Record<string, Record<string, unknown>> = {
  '/bad-amount': { amount: 'abc' },
  '/negative': { amount: '-5' },
  '/bad-payto': { payTo: 'nobody' },
  '/other-chain': { network: 'eip155:1' },
}
const target = createServer((req, res) => {
  const base = `http://127.0.0.1:${(target.address() as AddressInfo).port}`
  const offer = { scheme: 'exact', network: info.network, token: info.token, amount: '10', payTo: info.token, resource: `${base}${req.url}`, ...offers[req.url ?? ''] }
  res.writeHead(402, { 'content-type': 'application/json' })
  res.end(JSON.stringify(offer))
})
await new Promise<void>((r) => target.listen(0, '127.0.0.1', r))
t.teardown(() => new Promise<void>((r) => target.close(() => r())))
const base = `http://127.0.0.1:${(target.address() as AddressInfo).port}`

t.test('an x402 body no entry of which can be read is payment_protocol_error', async (t) => {
  for (const path of ['/bad-amount', '/negative', '/bad-payto']) {
    const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${base}${path}`, method: 'GET' } })
    t.same([r.status, r.body.error], [502, 'payment_protocol_error'], `${path}: ${r.text}`)
  }
  const other = await gw.api('POST', '/v1/pay', { body: { agentId: 'payer', endpoint: `${base}/other-chain`, method: 'GET' } })
  t.same([other.status, other.body.error], [402, 'no_payable_offer'], 'a readable offer for another chain is still no_payable_offer')
  const listed = await gw.api('GET', '/v1/transactions?agentId=payer')
  t.same(listed.body.transactions, [], 'nothing signed or recorded')
})
