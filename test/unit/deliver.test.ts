import t from 'tap'
import { Readable } from 'node:stream'
import { Registry } from '../../src/agents/registry.js'
import type { Chain } from '../../src/chain/chain.js'
import type { Delivery, Plan } from '../../src/engine/adapters/types.js'
import { Balances } from '../../src/engine/balances.js'
import { deliver, type DeliverDeps } from '../../src/engine/deliver.js'
import type { PaygateError } from '../../src/errors/index.js'
import { Leases } from '../../src/engine/leases.js'
import { Recorder } from '../../src/engine/record.js'
import { EventBus } from '../../src/events/bus.js'
import { RecordHooks } from '../../src/ledger/record-hooks.js'
import { newTxId, Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import { PolicyStore } from '../../src/policy/store.js'
import { heldAmount, hold } from '../../src/policy/usage.js'
import { systemClock } from '../../src/util/clock.js'
import { testStore } from '../helpers/gateway.js'

/**
 * The deliver stage's unpaid endings on a real store, without a gateway: the chain is a
 * function saying whether the nonce is used, the plan's deliveries are scripted. (Paid
 * endings go through the ledger outbox: the integration tests cover them.)
 */
const { store } = await testStore(t, 'paygate-deliver-')
const registry = new Registry(store, systemClock)
const policies = new PolicyStore(store, registry, systemClock)
const transactions = new Transactions(store)
const recorder = new Recorder({
  store,
  policies,
  transactions,
  outbox: null as never,
  events: new EventBus(),
  hooks: new RecordHooks(),
  clock: systemClock,
  balances: new Balances(async () => 0n, systemClock),
})
let used: () => Promise<boolean> = async () => false
const chain = { authorizationUsed: () => used() } as unknown as Chain
const deps: DeliverDeps = { chain, outbox: null as never, recorder, leases: new Leases(), events: new EventBus(), clock: systemClock, bodyTimeoutMs: 1_000 }

const answer = (status: number, headers: Record<string, string> = {}) => ({ status, headers, body: Readable.from([Buffer.from('{}')]) })
function planOf(script: Delivery[]): Plan & { sent: number } {
  const p = {
    sent: 0,
    protocol: 'x402',
    rail: 'stablecoin',
    deliver: async (): Promise<Delivery> => script[Math.min(p.sent++, script.length - 1)]!,
    settlement: () => null,
  }
  return p as unknown as Plan & { sent: number }
}
async function reserved(validForS: number): Promise<TxRecord> {
  const { agent } = await registry.createAgent()
  const now = Date.now()
  const rec: TxRecord = {
    ...{ id: newTxId(now), agentId: agent.agentId, status: 'pending', createdAt: now, updatedAt: now, endpoint: 'https://api.example/x', method: 'GET', protocol: 'x402' },
    ...{ amount: '10000', txHash: null, parentTxHash: null, depth: 0 },
    authorization: {
      from: '0x00000000000000000000000000000000000000aa',
      to: '0x',
      value: '10000',
      validAfter: '0',
      validBefore: String(Math.floor(now / 1000) + validForS),
      nonce: `0x${'22'.repeat(32)}`,
      signature: '0x1',
    },
  }
  await store.batch([...transactions.ops(rec), policies.usageOp(rec.agentId, hold(await policies.usageOf(rec.agentId), { id: rec.id, amount: rec.amount, at: now }))])
  return rec
}
const req = (agentId: string) => ({ agentId, url: 'https://api.example/x', method: 'GET', headers: {}, body: null })
const stateOf = async (rec: TxRecord) => ({ status: (await transactions.get(rec.id))!.status, held: heldAmount(await policies.usageOf(rec.agentId)) })

t.test('refused, and unused on chain while still valid: payment_failed, held for the reconciler', async (t) => {
  used = async () => false
  const rec = await reserved(300)
  const plan = planOf([{ kind: 'refused', response: answer(402), error: 'target answered 402' }])
  await t.rejects(deliver(deps, req(rec.agentId), plan, rec), { code: 'payment_failed' })
  t.equal(plan.sent, 1, 'a refusal the chain confirms is not resent')
  t.same(await stateOf(rec), { status: 'unknown', held: 10_000n })
})

t.test('5xx three times while the chain cannot say: the same authorization three times, then held', async (t) => {
  used = async () => Promise.reject(new Error('chain silent'))
  const rec = await reserved(300)
  const plan = planOf([{ kind: 'transient', response: answer(503), error: 'target answered 503' }])
  await t.rejects(deliver(deps, req(rec.agentId), plan, rec), { code: 'payment_failed' })
  t.equal(plan.sent, 3)
  t.same(await stateOf(rec), { status: 'unknown', held: 10_000n })
})

t.test('refused, unused and already expired: failed, and the reservation released', async (t) => {
  used = async () => false
  const rec = await reserved(-10)
  await t.rejects(deliver(deps, req(rec.agentId), planOf([{ kind: 'refused', response: null, error: 'no' }]), rec), { code: 'payment_failed' })
  t.same(await stateOf(rec), { status: 'failed', held: 0n })
})

t.test('a 2xx that reports no settlement, unused on chain: the answer is passed on and the payment held', async (t) => {
  used = async () => false
  const rec = await reserved(300)
  const out = await deliver(deps, req(rec.agentId), planOf([{ kind: 'served', response: answer(200) }]), rec)
  t.match(out, { payment: null, held: { transactionId: rec.id }, response: { status: 200 } })
  t.same(await stateOf(rec), { status: 'unknown', held: 10_000n })
})

t.test('paid, but the record cannot be written (the store not answering): unavailable, never "safe to retry"; the payment stays open and held', async (t) => {
  used = async () => true
  const failing = new Recorder({
    store,
    policies,
    transactions,
    outbox: { record: () => Promise.reject(new Error('Connection terminated unexpectedly')), signAhead: () => {} } as never,
    events: new EventBus(),
    hooks: new RecordHooks(),
    clock: systemClock,
    balances: new Balances(async () => 0n, systemClock),
  })
  const rec = await reserved(300)
  const plan = planOf([{ kind: 'served', response: answer(200) }])
  const err = await deliver({ ...deps, recorder: failing }, req(rec.agentId), plan, rec).catch((e: unknown) => e as PaygateError)
  t.match(err, { code: 'unavailable', status: 503, extra: { transactionId: rec.id } })
  t.match((err as PaygateError).detail, /money may have moved: do not pay again/)
  t.notMatch((err as PaygateError).detail, /safe to retry/)
  t.same((err as PaygateError).headers, {}, 'no Retry-After: a retry would pay again')
  t.same(await stateOf(rec), { status: 'pending', held: 10_000n }, 'left for the reconciler to settle from the chain')
})
