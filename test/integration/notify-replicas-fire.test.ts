import t, { type Test } from 'tap'
import { Writable } from 'node:stream'
import { Registry } from '../../src/agents/registry.js'
import { createLogger } from '../../src/log/index.js'
import { EgressGuard } from '../../src/net/egress.js'
import { buildNotifications, type Notifications } from '../../src/notify/index.js'
import type { EventEntry } from '../../src/notify/model.js'
import { PolicyStore } from '../../src/policy/store.js'
import { Store } from '../../src/store/index.js'
import { CrossLocks } from '../../src/store/leases.js'
import { ManualClock } from '../../src/util/clock.js'
import { Keystore } from '../../src/wallet/keystore.js'
import { testDir } from '../helpers/gateway.js'
import { testDatabase } from '../helpers/postgres.js'
import { startReceiver } from '../helpers/receiver.js'

/**
 * The notifier with two replicas on one PostgreSQL database: both hold the same event entries
 * (left by a replica that stopped before expanding them) and expand them at once. Each entry is
 * expanded once, a budget threshold fires once for the period across both, and every webhook
 * is signed with the one stored secret.
 */
const log = createLogger(
  'warn',
  new Writable({
    write(_c, _e, cb) {
      cb()
    },
  }),
)
const egress = new EgressGuard({ allow: [], deny: [], log })
const MASTER = 'ef'.repeat(32)
const USDC = 1_000_000

interface Replica {
  store: Store
  clock: ManualClock
  registry: Registry
  n: Notifications
}

async function replica(t: Test, url: string): Promise<Replica> {
  const clock = new ManualClock()
  const store = await Store.open(testDir(t), { postgresUrl: url })
  const registry = new Registry(store, clock)
  const policies = new PolicyStore(store, registry, clock)
  const { keystore } = await Keystore.open(testDir(t), MASTER, store.collection('meta'))
  const locks = new CrossLocks(store, clock)
  const release = locks.holdReplicaLease()
  const n = buildNotifications({
    ...{ store, registry, policies, keystore, egress, clock, log, owners: locks },
    settings: { timeoutMs: 5000, concurrency: 4, retentionDays: 7, endpointPerMinute: 1000, smtp: null },
  })
  await n.start()
  t.teardown(async () => {
    await n.close()
    await release()
    await store.close()
  })
  return { store, clock, registry, n }
}

t.test('two replicas expanding the same entries at once: each once, a threshold once, one signing secret', async (t) => {
  const url = await testDatabase()
  const a = await replica(t, url)
  const b = await replica(t, url)
  const secret = await a.n.secret.get()
  const rx = await startReceiver(t, { secret: () => secret })
  const agents = new Registry(a.store, a.clock)
  await agents.createAgent('x')
  const budget = await a.n.book.create({ agentId: 'x', type: 'budget_pct', threshold: 50, notify: { type: 'webhook', url: `${rx.url}/budget` } })
  await a.n.book.create({ agentId: 'x', type: 'policy_violation', notify: { type: 'webhook', url: `${rx.url}/violation` } })
  // B sees A's alerts at its next reload (every 2 s).
  const end = Date.now() + 20_000
  while (b.n.book.ofAgent('x').length < 2 && Date.now() < end) await new Promise((r) => setTimeout(r, 50))
  t.equal(b.n.book.ofAgent('x').length, 2, "B's alert book has A's alerts")

  // Entries a stopped replica wrote: ten payments taking the day's spend to 100% of a 10 USDC budget, and six refusals.
  const t0 = a.clock.now()
  const id = (i: number) => `ev_${t0.toString(36).padStart(9, '0')}${i.toString(36).padStart(6, '0')}zzzzzz`
  const entries: EventEntry[] = []
  for (let i = 1; i <= 10; i++) {
    entries.push({ id: id(i), kind: 'paid', agentId: 'x', at: t0, txId: `tx_p${i}`, amount: String(USDC), usedToday: String(i * USDC), periodStart: t0, dailyBudget: String(10 * USDC) })
  }
  for (let i = 11; i <= 16; i++) entries.push({ id: id(i), kind: 'violation', agentId: 'x', at: t0, txId: `tx_v${i}`, reason: 'domain_blocked', detail: 'no', endpoint: 'https://x.test/' })
  const events = a.store.collection<EventEntry>('notifyEvents')
  await a.store.batch(entries.map((e) => ({ type: 'put' as const, coll: events as never, key: e.id, value: e })))

  // Both find them orphaned (30 s old) at the same look, and expand them at once.
  a.clock.advance(31_000)
  b.clock.advance(31_000)
  t.same(await Promise.all([a.n.notifier.orphans(), b.n.notifier.orphans()]), [16, 16], 'both replicas hold all sixteen')
  await Promise.all([a.n.settle(), b.n.settle()])
  await Promise.all([a.n.settle(), b.n.settle()])

  const left: string[] = []
  for await (const k of events.keys()) left.push(k)
  t.same(left, [], 'every entry expanded (and deleted)')
  const budgetHits = rx.got.filter((g) => g.path === '/budget')
  t.same(budgetHits.map((g) => g.body.threshold).sort(), [50, 80], "the alert's 50% once and the built-in 80% warning once, not once per replica")
  t.ok(
    budgetHits.every((g) => g.body.event === 'budget.warning' && g.body.agentId === 'x'),
    'budget.warning payloads',
  )
  const violations = rx.got.filter((g) => g.path === '/violation').map((g) => g.body.event)
  t.equal(violations.length, 6, 'one policy.violation per refusal')
  t.equal(rx.got.length, 8, 'nothing else, nothing twice')
  t.ok(
    rx.got.every((g) => g.verified === true && g.answered === 200),
    'every webhook signed with the stored secret, which B reads too',
  )
  t.equal(await b.n.secret.get(), secret, 'one secret for both')
  const fired = await a.n.book.firedColl.get(budget.alertId)
  t.same(fired, { period: t0 }, 'the fired state names the period')
})

t.test('an agent deleted through a replica that has not loaded its newest alert yet: the alert goes with it', async (t) => {
  const url = await testDatabase()
  const a = await replica(t, url)
  const b = await replica(t, url)
  b.n.book.stopRefreshing() // B's reload must not run in between
  await a.registry.createAgent('gone')
  const alert = await a.n.book.create({ agentId: 'gone', type: 'policy_violation', notify: { type: 'webhook', url: 'http://127.0.0.1:9/x' } })
  t.same(b.n.book.ofAgent('gone'), [], "B has not reloaded A's alert yet")
  await b.registry.deleteAgent('gone')
  t.equal(await b.n.book.alertsColl.get(alert.alertId), undefined, "deleted with the agent, from the store's list")
})

t.test('a paid record through a replica (no policy cache): the budget the change carries decides whether an event entry is written', async (t) => {
  const url = await testDatabase()
  const a = await replica(t, url)
  const at = a.clock.now()
  const paid = (id: string, usedUnits: number, dailyBudget: string | null | undefined) => {
    const record = { id, agentId: 'q', amount: String(USDC), updatedAt: at, createdAt: at, status: 'paid', endpoint: 'https://x.test/' } as never
    const usage = { periodStart: at, spent: String(usedUnits), payments: [] }
    return a.n.notifier.contributor({ kind: 'paid', record, prev: record, usage, ...(dailyBudget !== undefined ? { dailyBudget } : {}) })
  }
  const entries = (ops: ReturnType<typeof paid>) => ops.filter((o) => o.coll.name === 'notifyEvents')
  t.equal(entries(paid('tx_1', USDC, null)).length, 0, 'no budget, no alerts: nothing can fire, no entry')
  t.equal(entries(paid('tx_2', 5 * USDC, String(10 * USDC))).length, 0, 'under 80% of the budget: no entry')
  const over = entries(paid('tx_3', 9 * USDC, String(10 * USDC)))
  t.equal(over.length, 1, 'at 90%: an entry (the built-in warning may fire)')
  t.match((over[0] as { value: unknown }).value, { kind: 'paid', dailyBudget: String(10 * USDC), usedToday: String(9 * USDC) }, 'carrying the budget (no policy read to expand it)')
  t.equal(entries(paid('tx_4', USDC, undefined)).length, 1, 'budget unknown: an entry, as before')
  // These ops were never written: past 30 s the notifier forgets the entries it was told of.
  a.clock.advance(31_000)
  await a.n.settle()
  t.equal(a.n.notifier.backlog(), 0)
})
