import t from 'tap'
import { Registry } from '../../src/agents/registry.js'
import { MppSessions } from '../../src/engine/sessions.js'
import { PolicyStore } from '../../src/policy/store.js'
import type { Collection } from '../../src/store/index.js'
import { systemClock } from '../../src/util/clock.js'
import { Keystore } from '../../src/wallet/keystore.js'
import { Wallets } from '../../src/wallet/wallets.js'
import { testStore } from '../helpers/gateway.js'

/**
 * Revokes and deletes racing with reads, interleaved deterministically on a real store: a
 * reader is held between its store read and its cache write while the change runs.
 */
const { store, dir } = await testStore(t, 'paygate-races-')
const registry = new Registry(store, systemClock)
const policies = new PolicyStore(store, registry, systemClock)

/** Hold the next `get(key)` of a collection once it has read, until `release`; other reads pass. */
function holdNextRead<T>(coll: Collection<T>, key: string): { reached: Promise<void>; release: () => void } {
  const read = Object.getPrototypeOf(coll).get as Collection<T>['get']
  let reached!: () => void
  let release!: () => void
  const reachedP = new Promise<void>((r) => (reached = r))
  const released = new Promise<void>((r) => (release = r))
  coll.get = async (k: string): Promise<T | undefined> => {
    const v = await read.call(coll, k)
    if (k !== key) return v
    delete (coll as Partial<Collection<T>>).get
    reached()
    await released
    return v
  }
  return { reached: reachedP, release }
}

t.test('a key revoked while it is being verified is not cached as valid', async (t) => {
  await registry.createAgent('r1')
  const k = await registry.issueAgentKey('r1')
  const hold = holdNextRead(store.collection('keys'), k.keyId)
  const verifying = registry.verify(k.apiKey)
  await hold.reached
  await registry.revokeKey(k.keyId)
  hold.release()
  t.equal(await verifying, null, 'the read the revoke overtook is redone')
  t.equal(await registry.verify(k.apiKey), null, 'the revoked key stays refused')
})

t.test('a key of an agent deleted while it is being verified is not cached as valid', async (t) => {
  const { key } = await registry.createAgent('r2')
  const hold = holdNextRead(store.collection('keys'), key.keyId)
  const verifying = registry.verify(key.apiKey)
  await hold.reached
  await registry.deleteAgent('r2')
  hold.release()
  t.equal(await verifying, null)
  t.equal(await registry.verify(key.apiKey), null, 'the deleted agent key stays refused')
})

t.test('an agent deleted while it is being read is not cached as existing', async (t) => {
  await registry.createAgent('r3')
  const hold = holdNextRead(store.collection('agents'), 'r3')
  const reading = registry.getAgent('r3')
  await hold.reached
  await registry.deleteAgent('r3')
  hold.release()
  t.equal(await reading, undefined, 'the read the delete overtook is redone')
  t.equal(registry.cachedAgent('r3'), undefined, 'nothing cached')
  t.equal(await registry.getAgent('r3'), undefined)
  await t.rejects(registry.requireAgent('r3'), { code: 'not_found' })
})

t.test('a policy read while its agent is deleted does not pass to an agent recreated under that id', async (t) => {
  await registry.createAgent('p1')
  await policies.update('p1', { dailyBudget: { usdc: 7 }, blockedDomains: ['old.example'] })
  // Hold the delete after every cascade has given its ops, before its batch is written.
  let cascaded!: () => void
  let proceed!: () => void
  const atBatch = new Promise<void>((r) => (cascaded = r))
  const go = new Promise<void>((r) => (proceed = r))
  let holding = true
  registry.onAgentDelete(async () => {
    if (holding) {
      holding = false
      cascaded()
      await go
    }
    return []
  })
  const deleting = registry.deleteAgent('p1')
  await atBatch
  const during = await policies.policyOf('p1')
  t.equal(during.dailyBudget, '7000000', 'before the delete is written the agent still has its policy')
  proceed()
  await deleting
  t.equal(policies.cachedPolicy('p1'), undefined, 'the cache is cleared once the delete is written')
  await registry.createAgent('p1')
  const fresh = await policies.view('p1')
  t.notOk('dailyBudget' in fresh, 'the new agent has no budget')
  t.same(fresh.blockedDomains, [], 'and no blocked domains')
})

t.test('a policy read that the delete overtakes is not cached', async (t) => {
  await registry.createAgent('p2')
  // Stored, not cached: the next read goes to the store.
  await store.collection('policies').put('p2', { dailyBudget: '9000000', blockedDomains: ['old.example'], protocolPreference: 'auto' })
  const hold = holdNextRead(store.collection('policies'), 'p2')
  const reading = policies.policyOf('p2')
  await hold.reached
  await registry.deleteAgent('p2')
  hold.release()
  await reading
  t.equal(policies.cachedPolicy('p2'), undefined, 'the stale read is not cached')
  await registry.createAgent('p2')
  t.notOk('dailyBudget' in (await policies.view('p2')), 'the recreated agent has the default policy')
})

t.test('a policy read that an update overtakes does not replace the updated policy in the cache', async (t) => {
  await registry.createAgent('p3')
  await store.collection('policies').put('p3', { dailyBudget: '1000000', blockedDomains: [], protocolPreference: 'auto' })
  const hold = holdNextRead(store.collection('policies'), 'p3')
  const reading = policies.policyOf('p3')
  await hold.reached
  await policies.update('p3', { dailyBudget: { usdc: 2 } })
  hold.release()
  t.equal((await reading).dailyBudget, '2000000', 'the slow read answers the newer cached policy')
  t.equal(policies.cachedPolicy('p3')?.dailyBudget, '2000000')
  t.same((await policies.view('p3')).dailyBudget, { usdc: 2, usedToday: 0 })
})

t.test('a wallet read that the agent delete overtakes is not cached: an agent recreated under that id has no wallet', async (t) => {
  const { keystore } = await Keystore.open(dir, null, store.collection<string>('meta'))
  const wallets = new Wallets(store, registry, keystore, systemClock)
  await registry.createAgent('w1')
  const w = await wallets.create('w1')
  const hold = holdNextRead(store.collection('wallets'), 'w1')
  const signing = wallets.signer('w1')
  await hold.reached
  await registry.deleteAgent('w1')
  hold.release()
  t.equal((await signing).address, w.address, 'the read that began before the delete answers what it read')
  await registry.createAgent('w1')
  t.equal(await wallets.get('w1'), undefined, 'the recreated agent has no wallet')
  await t.rejects(wallets.signer('w1'), { code: 'not_found' }, 'and cannot sign with the old one')
})

t.test('an MPP session read that the agent delete overtakes is not cached', async (t) => {
  const sessions = new MppSessions(store, registry, systemClock)
  await registry.createAgent('s1')
  await sessions.save('s1', 'https://svc.example', { token: 'old-token', expiresAt: Date.now() + 60_000, createdAt: Date.now(), transactionId: 'tx_x' })
  const fresh = new MppSessions(store, registry, systemClock) // nothing cached: the next read goes to the store
  const hold = holdNextRead(store.collection('mppSessions'), 's1\x00https://svc.example')
  const reading = fresh.valid('s1', 'https://svc.example')
  await hold.reached
  await registry.deleteAgent('s1')
  hold.release()
  t.equal((await reading)?.token, 'old-token')
  t.equal(fresh.cachedValid('s1', 'https://svc.example'), undefined, 'the stale read is not cached')
  await registry.createAgent('s1')
  t.equal(await fresh.valid('s1', 'https://svc.example'), null, 'the recreated agent has no session')
})

t.test('MPP sessions: a save during a read, or during a drop of the old token, is kept', async (t) => {
  const sessions = new MppSessions(store, registry, systemClock)
  const origin = 'https://svc2.example'
  const key = `s2\x00${origin}`
  const session = (token: string) => ({ token, expiresAt: Date.now() + 60_000, createdAt: Date.now(), transactionId: 'tx_y' })

  const hold = holdNextRead(store.collection('mppSessions'), key)
  const reading = sessions.valid('s2', origin)
  await hold.reached
  await sessions.save('s2', origin, session('bought-meanwhile'))
  hold.release()
  t.equal((await reading)?.token, 'bought-meanwhile', 'the slower read answers the newer session')
  t.equal(sessions.cachedValid('s2', origin)?.token, 'bought-meanwhile', 'and does not cache "none" over it')

  const holdDrop = holdNextRead(store.collection('mppSessions'), key)
  const dropping = sessions.drop('s2', origin, 'bought-meanwhile')
  await holdDrop.reached
  const saving = sessions.save('s2', origin, session('renegotiated'))
  holdDrop.release()
  await Promise.all([dropping, saving])
  t.equal((await sessions.valid('s2', origin))?.token, 'renegotiated', 'the drop of the refused token never removes the new one')
  t.equal((await store.collection<{ token: string }>('mppSessions').get(key))?.token, 'renegotiated', 'in the store too')
})
