import t from 'tap'
import { startTestGateway } from '../helpers/gateway.js'

const gw = await startTestGateway()
t.teardown(() => gw.close())

t.test('create, read, list and delete agents', async (t) => {
  const r = await gw.api('POST', '/v1/agents', { body: { agentId: 'research.bot-1' } })
  t.equal(r.status, 201)
  t.equal(r.body.agentId, 'research.bot-1')
  t.match(r.body.apiKey, /^rp_agent_[0-9A-Za-z]{32,}$/)
  t.match(r.body.keyId, /^key_/)
  t.ok(!Number.isNaN(Date.parse(r.body.createdAt)))

  const gen = await gw.api('POST', '/v1/agents')
  t.equal(gen.status, 201, 'no body at all: agentId generated')
  t.match(gen.body.agentId, /^[A-Za-z0-9._-]{1,64}$/)

  const dup = await gw.api('POST', '/v1/agents', { body: { agentId: 'research.bot-1' } })
  t.equal(dup.status, 409)
  t.equal(dup.body.error, 'conflict')

  // Only dots: URL parsing drops `.` and `..` path segments, so /v1/agents/.. could never reach it.
  for (const bad of ['', 'has space', 'x'.repeat(65), 'a/b', 'ünï', 42, 'invoke', '.', '..', '...']) {
    const res = await gw.api('POST', '/v1/agents', { body: { agentId: bad } })
    t.equal(res.status, 400, `agentId ${JSON.stringify(bad)}`)
    t.same([res.body.error, res.body.field], ['invalid_request', 'agentId'])
  }
  const unknown = await gw.api('POST', '/v1/agents', { body: { agentId: 'z', role: 'admin' } })
  t.same([unknown.status, unknown.body.field], [400, 'role'])

  const one = await gw.api('GET', '/v1/agents/research.bot-1')
  t.equal(one.status, 200)
  t.same(one.body, { agentId: 'research.bot-1', createdAt: r.body.createdAt })
  t.notOk('apiKey' in one.body, 'the key is shown once only')

  const list = await gw.api('GET', '/v1/agents?limit=1')
  t.equal(list.body.agents.length, 1)
  t.type(list.body.nextCursor, 'string')
  const rest = await gw.api('GET', `/v1/agents?limit=10&cursor=${encodeURIComponent(list.body.nextCursor)}`)
  t.equal(rest.body.agents.length, 1)
  t.equal(rest.body.nextCursor, null)
  t.equal((await gw.api('GET', '/v1/agents?limit=0')).body.field, 'limit')
  const pasted = await gw.api('GET', `/v1/agents?cursor=${encodeURIComponent('<nextCursor>')}`)
  t.same([pasted.status, pasted.body.field], [400, 'cursor'], 'a cursor that no page gave is refused, not read as the first page')

  t.equal((await gw.api('GET', '/v1/agents/nobody')).status, 404)
  t.equal((await gw.api('GET', '/v1/agents/nobody')).body.error, 'not_found')

  // Deleting an agent stops its keys at once and removes its policy.
  await gw.api('PUT', '/v1/policies/research.bot-1', { body: { dailyBudget: { usdc: 5 } } })
  t.equal((await gw.api('GET', '/v1/policies/research.bot-1', { key: r.body.apiKey })).status, 200)
  t.equal((await gw.api('DELETE', '/v1/agents/research.bot-1')).status, 204)
  const after = await gw.api('GET', '/v1/policies/research.bot-1', { key: r.body.apiKey })
  t.same([after.status, after.body.error], [401, 'unauthorized'])
  t.equal((await gw.api('GET', '/v1/agents/research.bot-1')).status, 404)
  t.equal((await gw.api('DELETE', '/v1/agents/research.bot-1')).status, 404)
  const again = await gw.api('POST', '/v1/agents', { body: { agentId: 'research.bot-1' } })
  t.equal(again.status, 201, 'the id can be reused')
  t.same((await gw.api('GET', '/v1/policies/research.bot-1')).body.blockedDomains, [], 'with a fresh policy')
  t.notOk((await gw.api('GET', '/v1/policies/research.bot-1')).body.dailyBudget)
})

t.test('ids with dots that are not only dots are reachable', async (t) => {
  for (const id of ['.hidden', 'a..b', '..x', '...x']) {
    t.equal((await gw.api('POST', '/v1/agents', { body: { agentId: id } })).status, 201, `create ${id}`)
    t.equal((await gw.api('GET', `/v1/agents/${id}`)).body.agentId, id, `read ${id}`)
  }
})

t.test('issue, list and revoke agent keys', async (t) => {
  const a = (await gw.api('POST', '/v1/agents', { body: { agentId: 'keys-agent' } })).body
  const k2 = await gw.api('POST', '/v1/agents/keys-agent/keys')
  t.equal(k2.status, 201)
  t.match(k2.body, { agentId: 'keys-agent', keyId: /^key_/, apiKey: /^rp_agent_/, prefix: /^rp_agent_[0-9A-Za-z]{4}$/ })
  t.not(k2.body.apiKey, a.apiKey)

  const list = await gw.api('GET', '/v1/agents/keys-agent/keys')
  t.equal(list.body.keys.length, 2)
  for (const k of list.body.keys) {
    t.same(Object.keys(k).sort(), ['agentId', 'createdAt', 'keyId', 'kind', 'prefix'])
    t.ok(a.apiKey.startsWith(k.prefix) || k2.body.apiKey.startsWith(k.prefix), 'prefix is the start of the key')
  }
  t.notMatch(list.text, /rp_agent_[0-9A-Za-z]{10,}/, 'no full key in the listing')

  // Both keys work; revoking one leaves the other working.
  t.equal((await gw.api('GET', '/v1/policies/keys-agent', { key: a.apiKey })).status, 200)
  t.equal((await gw.api('GET', '/v1/policies/keys-agent', { key: k2.body.apiKey })).status, 200)
  const rv = await gw.api('DELETE', `/v1/keys/${k2.body.keyId}`)
  t.equal(rv.status, 200)
  t.ok(rv.body.revokedAt)
  t.equal((await gw.api('GET', '/v1/policies/keys-agent', { key: k2.body.apiKey })).status, 401, 'revoked key refused at once (cache cleared)')
  t.equal((await gw.api('GET', '/v1/policies/keys-agent', { key: a.apiKey })).status, 200)
  t.equal((await gw.api('DELETE', `/v1/keys/${k2.body.keyId}`)).status, 200, 'revoking twice is harmless')
  t.equal((await gw.api('DELETE', '/v1/keys/key_nope')).status, 404)
  t.equal((await gw.api('POST', '/v1/agents/ghost/keys')).status, 404)
  t.equal((await gw.api('GET', '/v1/agents/ghost/keys')).status, 404)
})

t.test('account keys: issue, list, rotate; the last one cannot be revoked', async (t) => {
  const keys = (await gw.api('GET', '/v1/keys')).body.keys
  t.equal(keys.length, 1, 'the bootstrap key')
  t.equal(keys[0].kind, 'account')
  const bootstrapId = keys[0].keyId
  const last = await gw.api('DELETE', `/v1/keys/${bootstrapId}`)
  t.same([last.status, last.body.error], [409, 'conflict'])

  const nk = await gw.api('POST', '/v1/keys')
  t.equal(nk.status, 201)
  t.match(nk.body.apiKey, /^rp_live_[0-9A-Za-z]{32,}$/)
  t.equal((await gw.api('GET', '/v1/agents', { key: nk.body.apiKey })).status, 200)
  // Rotate: revoke the bootstrap key using the new one.
  t.equal((await gw.api('DELETE', `/v1/keys/${bootstrapId}`, { key: nk.body.apiKey })).status, 200)
  t.equal((await gw.api('GET', '/v1/agents')).status, 401, 'the old account key stops working')
  const me = await gw.api('DELETE', `/v1/keys/${nk.body.keyId}`, { key: nk.body.apiKey })
  t.same([me.status, me.body.error], [409, 'conflict'])
})
