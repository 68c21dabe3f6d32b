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

t.test('unknown agents are 404', async (t) => {
  const g = await gw.api('GET', '/v1/policies/ghost')
  t.same([g.status, g.body.error], [404, 'not_found'])
  const p = await gw.api('PUT', '/v1/policies/ghost', { body: { dailyBudget: { usdc: 1 } } })
  t.same([p.status, p.body.error], [404, 'not_found'])
})
