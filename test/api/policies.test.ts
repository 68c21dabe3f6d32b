import t from 'tap'
import { startTestGateway } from '../helpers/gateway.js'

const gw = await startTestGateway()
t.teardown(() => gw.close())
const agent = (await gw.api('POST', '/v1/agents', { body: { agentId: 'pol' } })).body

t.test('a new agent has the default policy', async (t) => {
  const r = await gw.api('GET', '/v1/policies/pol')
  t.equal(r.status, 200)
  t.same(r.body, { agentId: 'pol', blockedDomains: [], protocolPreference: 'auto', sessionCalls: { total: 0, last24h: 0 } })
})

t.test('PUT merges and answers the policy as read back', async (t) => {
  const r = await gw.api('PUT', '/v1/policies/pol', {
    body: {
      dailyBudget: { usdc: 10.5 },
      perCallLimit: { usdc: 0.25 },
      allowedDomains: ['api.example.com', 'example.co.uk'],
      blockedDomains: ['evil.example.co.uk'],
      rateLimit: { calls: 60, window: '1h' },
      protocolPreference: 'mpp',
    },
  })
  t.equal(r.status, 200)
  t.match(r.body, {
    agentId: 'pol',
    dailyBudget: { usdc: 10.5, usedToday: 0 },
    perCallLimit: { usdc: 0.25 },
    allowedDomains: ['api.example.com', 'example.co.uk'],
    blockedDomains: ['evil.example.co.uk'],
    rateLimit: { calls: 60, window: '1h', usedThisHour: 0 },
    protocolPreference: 'mpp',
  })
  const g = await gw.api('GET', '/v1/policies/pol')
  t.same(g.body, r.body, 'GET reads the same back')

  const merged = await gw.api('PUT', '/v1/policies/pol', { body: { perCallLimit: { usdc: 1 } } })
  t.equal(merged.body.perCallLimit.usdc, 1)
  t.equal(merged.body.dailyBudget.usdc, 10.5, 'other fields kept')

  const removed = await gw.api('PUT', '/v1/policies/pol', { body: { dailyBudget: null, allowedDomains: null } })
  t.notOk('dailyBudget' in removed.body)
  t.notOk('allowedDomains' in removed.body, 'absent allowlist: any domain')
  t.equal(removed.body.perCallLimit.usdc, 1)
})

t.test('an agent key reads its own policy but cannot change it', async (t) => {
  t.equal((await gw.api('GET', '/v1/policies/pol', { key: agent.apiKey })).status, 200)
  const put = await gw.api('PUT', '/v1/policies/pol', { key: agent.apiKey, body: { dailyBudget: null } })
  t.same([put.status, put.body.error], [403, 'forbidden'])
})

t.test('invalid policies answer 400 naming the field, and change nothing', async (t) => {
  const before = (await gw.api('GET', '/v1/policies/pol')).body
  const cases: [unknown, string][] = [
    [{ dailyBudget: { usdc: -5 } }, 'dailyBudget.usdc'],
    [{ perCallLimit: { usdc: 0.0000001 } }, 'perCallLimit.usdc'],
    [{ rateLimit: { calls: 5, window: '2d' } }, 'rateLimit.window'],
    [{ protocolPreference: 'card' }, 'protocolPreference'],
    [{ allowedDomains: ['http://x.com/'] }, 'allowedDomains[0]'],
    [{ perCallLimit: { usdc: 1 }, dailyBudget: { usdc: 0 } }, 'dailyBudget.usdc'],
    [{ blockedDomains: ['ads.example.com\\.evil'] }, 'blockedDomains[0]'],
    [{ allowedDomains: ['%41.com'] }, 'allowedDomains[0]'],
    [{ allowedDomains: ['1.2.3'] }, 'allowedDomains[0]'],
    [{ dailyBudget: { usdc: 5, foo: 1 } }, 'dailyBudget.foo'],
    [{ rateLimit: { calls: 5, window: '1h', per: 'agent' } }, 'rateLimit.per'],
  ]
  for (const [body, field] of cases) {
    const r = await gw.api('PUT', '/v1/policies/pol', { body })
    t.equal(r.status, 400, JSON.stringify(body))
    t.same([r.body.error, r.body.field], ['invalid_request', field])
    t.type(r.body.detail, 'string')
  }
  t.same((await gw.api('GET', '/v1/policies/pol')).body, before, 'a rejected PUT changes nothing, not even partly')
})

t.test('GET of an unknown agent is 404; PUT with the account key creates it (keys from POST /v1/agents/<id>/keys)', async (t) => {
  const g = await gw.api('GET', '/v1/policies/ghost')
  t.same([g.status, g.body.error], [404, 'not_found'])
  const p = await gw.api('PUT', '/v1/policies/ghost', { body: { dailyBudget: { usdc: 1 } } })
  t.equal(p.status, 200, p.text)
  t.match(p.body, { agentId: 'ghost', dailyBudget: { usdc: 1 } })
  t.equal((await gw.api('GET', '/v1/agents/ghost')).status, 200, 'the agent exists')
  t.same((await gw.api('GET', '/v1/agents/ghost/keys')).body.keys, [], 'with no key until one is issued')
  const key = (await gw.api('POST', '/v1/agents/ghost/keys')).body.apiKey
  t.match((await gw.api('GET', '/v1/policies/ghost', { key })).body, { agentId: 'ghost', dailyBudget: { usdc: 1 } }, 'its own key reads its policy')
  t.equal((await gw.api('PUT', '/v1/policies/ghost', { key, body: {} })).status, 403, 'an agent key creates nothing')
  for (const id of ['invoke', 'bad%20id', 'x'.repeat(65)]) {
    const r = await gw.api('PUT', `/v1/policies/${id}`, { body: { dailyBudget: { usdc: 1 } } })
    t.same([r.status, r.body.error, r.body.field], [400, 'invalid_request', 'agentId'], `agentId ${id.slice(0, 10)} refused`)
  }
  const bad = await gw.api('PUT', '/v1/policies/ghost2', { body: { dailyBudget: { usdc: -1 } } })
  t.equal(bad.status, 400)
  t.equal((await gw.api('GET', '/v1/agents/ghost2')).status, 404, 'a refused body creates no agent')
})
