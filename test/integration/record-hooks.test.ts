import t from 'tap'
import { subscribe, unsubscribe } from 'node:diagnostics_channel'
import type { RecordChange } from '../../src/ledger/record-hooks.js'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * The seams the operating half hangs off: record-hook contributors write in the same batch as
 * each record change, and the payment channels publish what happened.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const { merchantOptions } = await testChain(gw)
const m = await startV2Merchant(await merchantOptions(10_000n))
t.teardown(() => m.close())

const hooked = gw.gw.store.collection<{ kind: string; status: string }>('hook-test')
gw.gw.hooks.add((c: RecordChange) => (c.kind === 'session' ? [] : [{ type: 'put', coll: hooked, key: `${c.record.id}:${c.kind}`, value: { kind: c.kind, status: c.record.status } }]))

const seen: { name: string; m: Record<string, unknown> }[] = []
const names = ['paygate:payment:reserved', 'paygate:payment:paid', 'paygate:payment:rejected', 'paygate:payment:failed']
const listeners = names.map((name) => {
  const fn = (m: unknown): void => void seen.push({ name, m: m as Record<string, unknown> })
  subscribe(name, fn)
  return [name, fn] as const
})
t.teardown(() => {
  for (const [name, fn] of listeners) unsubscribe(name, fn)
})

await gw.api('POST', '/v1/agents', { body: { agentId: 'hk' } })
await gw.api('POST', '/v1/wallets', { body: { agentId: 'hk' } })

t.test('a paid payment: the contributor wrote beside the reservation and beside the paid record; channels published', async (t) => {
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'hk', endpoint: `${m.url}/paid` } })
  t.equal(r.status, 200, r.text)
  const id = r.body.transactionId as string
  t.same(await hooked.get(`${id}:reserved`), { kind: 'reserved', status: 'pending' })
  t.same(await hooked.get(`${id}:paid`), { kind: 'paid', status: 'paid' })
  t.match(
    seen.filter((s) => s.m.transactionId === id).map((s) => s.name),
    ['paygate:payment:reserved', 'paygate:payment:paid'],
  )
  t.match(seen.find((s) => s.name === 'paygate:payment:paid')!.m, { agentId: 'hk', protocol: 'x402', amount: 10_000n })
})

t.test('a rejection: written with the rejected record, and published', async (t) => {
  await gw.api('PUT', '/v1/policies/hk', { body: { perCallLimit: { usdc: 0.001 } } })
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'hk', endpoint: `${m.url}/paid` } })
  t.same([r.status, r.body.reason], [402, 'per_call_limit_exceeded'], r.text)
  const [rec] = (await gw.api('GET', '/v1/transactions?agentId=hk&status=rejected')).body.transactions
  t.same(await hooked.get(`${rec.transactionId ?? rec.id}:rejected`), { kind: 'rejected', status: 'rejected' })
  t.match(seen.at(-1), { name: 'paygate:payment:rejected', m: { agentId: 'hk', reason: 'per_call_limit_exceeded' } })
})
