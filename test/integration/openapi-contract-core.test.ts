import t, { type Test } from 'tap'
import { readFileSync } from 'node:fs'
import { send } from '../helpers/contract-client.js'
import { AREAS, MAX_BODY_BYTES, assertCoverage, concrete, contractGateway, freshAddress, isPublic, sweep401, sweep405, sweep429 } from '../helpers/contract-sweeps.js'

/**
 * The API contract, part 1 of 3 (agents, keys, policies, wallets, chain, health, the public
 * documents): every route of this area driven for real, its success and each documented
 * error, every answer held to docs/openapi.json; the document lists exactly the routes the
 * router serves. Parts 2 and 3: openapi-contract-money, openapi-contract-ops.
 */
const { gw, contract, call } = await contractGateway(t)
const acct = gw.accountKey

let keyA = ''
let keyB = ''
const agent = async (t: Test, agentId: string): Promise<string> => (await call(t, { method: 'POST', path: '/v1/agents', key: acct, body: { agentId } }, 201)).body.apiKey
t.test('setup: two agents', async (t) => {
  keyA = await agent(t, 'c-a')
  keyB = await agent(t, 'c-b')
})

t.test('the document lists exactly the routes the router serves, public exactly where the router says', async (t) => {
  const shape = (p: string): string => p.replace(/\{[^}]+\}|:[^/]+/g, '{}')
  const served = gw.gw.routes().map((r) => `${r.method} ${shape(r.path)} ${r.access === 'public' ? 'public' : 'key'}`)
  const documented = contract.operations().map(({ method, path }) => `${method} ${shape(path)} ${isPublic(contract, path, method) ? 'public' : 'key'}`)
  t.same([...new Set(documented)].sort(), [...new Set(served)].sort())
  const all = [...AREAS.core, ...AREAS.money, ...AREAS.ops]
  t.same([...all].sort(), Object.keys(contract.doc.paths).sort(), 'the three contract test files together drive every documented path, each once')
  t.equal(new Set(all).size, all.length)
})

t.test('the document itself: served as it is, public, and every schema in it compiles in strict mode', async (t) => {
  const doc = await call(t, { method: 'GET', path: '/v1/openapi.json', key: null }, 200)
  t.same(doc.body, JSON.parse(readFileSync(new URL('../../docs/openapi.json', import.meta.url), 'utf8')))
  t.doesNotThrow(() => contract.compileAll())
})

t.test('public routes', async (t) => {
  await call(t, { method: 'GET', path: '/healthz', key: null }, 200)
  await call(t, { method: 'GET', path: '/readyz', key: null }, 200)
  const ca = await call(t, { method: 'GET', path: '/v1/ca.pem', key: null }, 200)
  t.match(ca.text, /^-----BEGIN CERTIFICATE-----/)
  const prom = await call(t, { method: 'GET', path: '/metrics', key: null }, 200)
  t.match(prom.text, /^# HELP /m)
})

t.test('agents', async (t) => {
  await call(t, { method: 'POST', path: '/v1/agents', key: acct, body: { agentId: 'c-a' } }, 409, 'conflict')
  const bad = await call(t, { method: 'POST', path: '/v1/agents', key: acct, body: { agentId: 'c-x', color: 'red' } }, 400, 'invalid_request')
  t.equal(bad.body.field, 'color')
  await call(t, { method: 'POST', path: '/v1/agents', key: keyA, body: {} }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/agents?limit=2', key: acct }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/agents?limit=0', key: acct }, 400, 'invalid_request')).body.field, 'limit')
  await call(t, { method: 'GET', path: '/v1/agents', key: keyA }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/agents/c-a', key: acct }, 200)
  await call(t, { method: 'GET', path: '/v1/agents/nobody', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: '/v1/agents/c-a', key: keyA }, 403, 'forbidden')
  await agent(t, 'c-del')
  await call(t, { method: 'DELETE', path: '/v1/agents/c-del', key: acct }, 204)
  await call(t, { method: 'DELETE', path: '/v1/agents/c-del', key: acct }, 404, 'not_found')
  await call(t, { method: 'DELETE', path: '/v1/agents/c-b', key: keyA }, 403, 'forbidden')
})

t.test('keys', async (t) => {
  const issued = await call(t, { method: 'POST', path: '/v1/agents/c-a/keys', key: acct }, 201)
  t.equal((await call(t, { method: 'POST', path: '/v1/agents/c-a/keys', key: acct, body: { label: 'x' } }, 400, 'invalid_request')).body.field, 'label')
  await call(t, { method: 'POST', path: '/v1/agents/nobody/keys', key: acct }, 404, 'not_found')
  await call(t, { method: 'POST', path: '/v1/agents/c-a/keys', key: keyA }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/agents/c-a/keys', key: acct }, 200)
  await call(t, { method: 'GET', path: '/v1/agents/nobody/keys', key: acct }, 404, 'not_found')
  await call(t, { method: 'GET', path: '/v1/agents/c-a/keys', key: keyA }, 403, 'forbidden')

  const second = await call(t, { method: 'POST', path: '/v1/keys', key: acct }, 201)
  t.equal((await call(t, { method: 'POST', path: '/v1/keys', key: acct, body: { label: 'x' } }, 400, 'invalid_request')).body.field, 'label')
  await call(t, { method: 'POST', path: '/v1/keys', key: keyA }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/keys', key: acct }, 200)
  await call(t, { method: 'GET', path: '/v1/keys', key: keyA }, 403, 'forbidden')

  await call(t, { method: 'DELETE', path: `/v1/keys/${issued.body.keyId}`, key: acct }, 200)
  await call(t, { method: 'DELETE', path: '/v1/keys/key_nothing', key: acct }, 404, 'not_found')
  await call(t, { method: 'DELETE', path: `/v1/keys/${second.body.keyId}`, key: keyA }, 403, 'forbidden')
  // The first account key revoked with the second: the second is then the last, and stays.
  const mine = (await send(gw.url, { method: 'GET', path: '/v1/me', key: acct })).body.keyId
  await call(t, { method: 'DELETE', path: `/v1/keys/${mine}`, key: second.body.apiKey }, 200)
  await call(t, { method: 'DELETE', path: `/v1/keys/${second.body.keyId}`, key: second.body.apiKey }, 409, 'conflict')
  // The second account key is the one for the rest of the file.
  gw.accountKey = second.body.apiKey
})

t.test('policies', async (t) => {
  const k = gw.accountKey
  await call(
    t,
    { method: 'PUT', path: '/v1/policies/c-a', key: k, body: { dailyBudget: { usdc: 5 }, perCallLimit: { usdc: 1 }, rateLimit: { calls: 10, window: '1h' }, blockedDomains: ['evil.test'] } },
    200,
  )
  t.equal((await call(t, { method: 'PUT', path: '/v1/policies/c-a', key: k, body: { perCallLimit: { usdc: 'lots' } } }, 400, 'invalid_request')).body.field, 'perCallLimit.usdc')
  await call(t, { method: 'PUT', path: '/v1/policies/c-a', key: keyA, body: {} }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/policies/c-a', key: k }, 200)
  await call(t, { method: 'GET', path: '/v1/policies/c-a', key: keyA }, 200)
  await call(t, { method: 'GET', path: '/v1/policies/c-a', key: keyB }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/policies/nobody', key: k }, 404, 'not_found')
})

t.test('wallets and the chain', async (t) => {
  const k = gw.accountKey
  await call(t, { method: 'POST', path: '/v1/wallets', key: k, body: { agentId: 'c-a' } }, 201)
  await call(t, { method: 'POST', path: '/v1/wallets', key: k, body: { agentId: 'c-a' } }, 409, 'conflict')
  t.equal((await call(t, { method: 'POST', path: '/v1/wallets', key: k, body: {} }, 400, 'invalid_request')).body.field, 'agentId')
  await call(t, { method: 'POST', path: '/v1/wallets', key: keyB, body: { agentId: 'c-b' } }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/wallets/c-a', key: keyA }, 200)
  await call(t, { method: 'GET', path: '/v1/wallets/c-b', key: k }, 404, 'not_found')
  await call(t, { method: 'GET', path: '/v1/wallets/c-a', key: keyB }, 403, 'forbidden')
  await call(t, { method: 'POST', path: '/v1/wallets/c-a/faucet', key: k, body: { usdc: 2 } }, 200)
  t.equal((await call(t, { method: 'POST', path: '/v1/wallets/c-a/faucet', key: k, body: { usdc: -1 } }, 400, 'invalid_request')).body.field, 'usdc')
  await call(t, { method: 'POST', path: '/v1/wallets/c-b/faucet', key: k, body: { usdc: 1 } }, 404, 'not_found')
  await call(t, { method: 'POST', path: '/v1/wallets/c-a/faucet', key: keyA, body: { usdc: 1 } }, 403, 'forbidden')
  await call(t, { method: 'GET', path: '/v1/chain', key: k }, 200)
  await call(t, { method: 'GET', path: '/v1/chain', key: keyA }, 403, 'forbidden')
})

t.test('who the key is, and the health summary', async (t) => {
  await call(t, { method: 'GET', path: '/v1/me', key: gw.accountKey }, 200)
  t.equal((await call(t, { method: 'GET', path: '/v1/me', key: keyA }, 200)).body.agentId, 'c-a')
  await call(t, { method: 'GET', path: '/v1/health', key: gw.accountKey }, 200)
  await call(t, { method: 'GET', path: '/v1/health', key: keyA }, 403, 'forbidden')
})

t.test('bodies over the limit: 413 on every operation of this area that takes one', async (t) => {
  const big = { agentId: 'c-big', pad: 'x'.repeat(MAX_BODY_BYTES + 100) }
  for (const path of AREAS.core) {
    for (const method of contract.methodsOf(path)) {
      if (!contract.doc.paths[path][method.toLowerCase()].requestBody) continue
      await call(t, { method, path: concrete(path), key: gw.accountKey, body: big }, 413, 'payload_too_large')
    }
  }
})

t.test('401 without a valid key, 405 for an undocumented method, 429 past the rate', async (t) => {
  await sweep401(t, gw, contract, 'core')
  await sweep405(t, gw, contract, 'core')
  await sweep429(t, gw, contract, 'core')
  // A revoked key is as good as none.
  const revoked = (await send(gw.url, { method: 'POST', path: '/v1/agents/c-a/keys', key: gw.accountKey })).body
  await send(gw.url, { method: 'DELETE', path: `/v1/keys/${revoked.keyId}`, key: gw.accountKey })
  await call(t, { method: 'GET', path: '/v1/wallets/c-a', key: revoked.apiKey, from: freshAddress() }, 401, 'unauthorized')
})

t.test('the chain gone: 503 where the document says so', async (t) => {
  const started = gw.logs.map((l) => JSON.parse(l)).find((j) => j.msg === 'anvil started')
  t.ok(started?.pid, 'the embedded anvil this gateway started')
  process.kill(started.pid, 'SIGKILL')
  const k = gw.accountKey
  const until = Date.now() + 5000
  while (Date.now() < until && (await send(gw.url, { method: 'GET', path: '/readyz' })).status !== 503) await new Promise((r) => setTimeout(r, 50))
  await call(t, { method: 'GET', path: '/readyz', key: null }, 503)
  await call(t, { method: 'GET', path: '/v1/wallets/c-a', key: k }, 503, 'unavailable')
  await call(t, { method: 'GET', path: '/v1/chain', key: k }, 503, 'unavailable')
  t.equal((await call(t, { method: 'GET', path: '/v1/health', key: k }, 200)).body.status, 'degraded')
})

t.test('coverage: every documented status of this area answered, nothing undocumented seen', async (t) => {
  assertCoverage(t, contract, 'core')
})
