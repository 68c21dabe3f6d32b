import t from 'tap'
import { Registry } from '../../src/agents/registry.js'
import type { FastSigner } from '../../src/crypto/secp256k1.js'
import type { Plan } from '../../src/engine/adapters/types.js'
import { Balances } from '../../src/engine/balances.js'
import { Leases } from '../../src/engine/leases.js'
import { Recorder } from '../../src/engine/record.js'
import { reserve, type ReserveDeps } from '../../src/engine/reserve.js'
import { AheadSigner } from '../../src/engine/sign-ahead.js'
import { EventBus } from '../../src/events/bus.js'
import { RecordHooks, type RecordChange } from '../../src/ledger/record-hooks.js'
import { newTxId, Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import { PolicyStore } from '../../src/policy/store.js'
import { heldAmount } from '../../src/policy/usage.js'
import { systemClock } from '../../src/util/clock.js'
import { outcome } from '../../src/util/result.js'
import { testStore } from '../helpers/gateway.js'

/**
 * The reserve stage on a real store, without a gateway: the policy decides, funds are checked
 * against the balance less what is held, and the hold, the record and the record hook's
 * operations are one batch. The wallet, the chain's balance and the plan are plain data.
 */
const { store } = await testStore(t, 'paygate-reserve-')
const registry = new Registry(store, systemClock)
const policies = new PolicyStore(store, registry, systemClock)
const transactions = new Transactions(store)
const hooks = new RecordHooks()
const seen: RecordChange['kind'][] = []
hooks.add((c) => {
  seen.push(c.kind)
  return []
})
let onChain = 1_000_000n
const balances = new Balances(async () => onChain, systemClock)
const recorder = new Recorder({ store, policies, transactions, outbox: null as never, events: new EventBus(), hooks, clock: systemClock, balances })
const deps: ReserveDeps = {
  policies,
  balances,
  recorder,
  aheadSigner: new AheadSigner({ policies, wallets: null as never, clock: systemClock, busy: () => true }),
  leases: new Leases(),
  clock: systemClock,
}

let wallets = 0
/** A wallet of its own per test: Balances caches a reading per address. */
const walletOf = (): FastSigner => ({ address: `0x${(++wallets).toString(16).padStart(40, '0')}`, signDigest65: () => `0x${'11'.repeat(65)}` }) as unknown as FastSigner
const wallet = walletOf()
const plan = (amount: bigint): Plan =>
  ({
    protocol: 'x402',
    rail: 'stablecoin',
    amount,
    offer: { shape: 'x402-v2', scheme: 'exact', network: 'eip155:1', asset: '0x', payTo: '0x', resource: null },
    fromWallet: true,
    signsLocally: true,
    authorize: async () => ({
      from: '0x00000000000000000000000000000000000000aa',
      to: '0x',
      value: String(amount),
      validAfter: '0',
      validBefore: '9999999999',
      nonce: `0x${'22'.repeat(32)}`,
      signature: '0x',
    }),
    deliver: async () => ({ kind: 'transient', response: null, error: 'not used here' }),
    settlement: () => null,
  }) as unknown as Plan
const base = (agentId: string, amount: bigint): TxRecord => {
  const now = Date.now()
  return {
    id: newTxId(now),
    agentId,
    status: 'pending',
    createdAt: now,
    updatedAt: now,
    endpoint: 'https://api.example/x',
    method: 'GET',
    protocol: 'x402',
    amount: String(amount),
    txHash: null,
    parentTxHash: null,
    depth: 0,
  }
}
const req = (agentId: string) => ({ agentId, url: 'https://api.example/x', method: 'GET', headers: {}, body: null })
async function agent(policy: object): Promise<string> {
  const { agent } = await registry.createAgent()
  await policies.update(agent.agentId, policy)
  return agent.agentId
}

t.test('concurrent reservations against a budget for exactly 3: 3 reserved, the rest rejected and recorded', async (t) => {
  const id = await agent({ dailyBudget: { usdc: 0.03 } })
  const runs = await Promise.all(Array.from({ length: 10 }, () => reserve(deps, req(id), plan(10_000n), base(id, 10_000n), outcome(Promise.resolve(wallet)))))
  for (const r of runs) t.ok((await r.written).ok)
  t.equal(runs.filter((r) => r.reservation.kind === 'reserved').length, 3)
  t.same(
    runs.filter((r) => r.reservation.kind === 'rejected').map((r) => (r.reservation as { reason: string }).reason),
    Array(7).fill('daily_budget_exceeded'),
  )
  t.equal(heldAmount(await policies.usageOf(id)), 30_000n, 'three holds')
  const listed = await transactions.list({ agentId: id, limit: 100 })
  t.equal(listed.records.filter((r) => r.status === 'pending').length, 3, 'pending records with their holds')
  t.equal(listed.records.filter((r) => r.status === 'rejected').length, 7, 'rejections recorded')
  t.ok(
    listed.records.filter((r) => r.status === 'pending').every((r) => r.authorization),
    'each reserved record carries its authorization',
  )
})

t.test('funds: the balance less what is held; short is a failed record, nothing held', async (t) => {
  const id = await agent({})
  onChain = 15_000n
  const own = walletOf()
  const first = await reserve(deps, req(id), plan(10_000n), base(id, 10_000n), outcome(Promise.resolve(own)))
  t.equal(first.reservation.kind, 'reserved')
  const second = await reserve(deps, req(id), plan(10_000n), base(id, 10_000n), outcome(Promise.resolve(own)))
  t.match(second.reservation, { kind: 'funds', balance: 15_000n, available: 5_000n })
  await second.written
  t.equal(heldAmount(await policies.usageOf(id)), 10_000n, 'only the first is held')
  const failed = (await transactions.list({ agentId: id, status: 'failed', limit: 10 })).records
  t.match(failed, [{ error: 'insufficient_funds' }])
  onChain = 1_000_000n
})

t.test('the policy decides before the wallet is asked; a missing wallet after that is thrown', async (t) => {
  const id = await agent({ blockedDomains: ['api.example'] })
  const noWallet = outcome(Promise.reject(new Error('no wallet')))
  const r = await reserve(deps, req(id), plan(1n), base(id, 1n), noWallet)
  t.match(r.reservation, { kind: 'rejected', reason: 'domain_blocked' })
  const open = await agent({})
  await t.rejects(reserve(deps, req(open), plan(1n), base(open, 1n), outcome(Promise.reject(new Error('no wallet')))), /no wallet/)
})

t.test('the record hook saw each change kind in its batch', async (t) => {
  t.ok(seen.includes('reserved') && seen.includes('rejected') && seen.includes('finished'))
})
