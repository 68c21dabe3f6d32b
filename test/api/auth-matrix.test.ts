import t from 'tap'
import { startTestGateway } from '../helpers/gateway.js'

/**
 * Every endpoint x {no key, malformed, revoked, this agent's key, another agent's key,
 * account key}: the expected status and error code.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())

const created = async (agentId?: string): Promise<{ agentId: string; apiKey: string; keyId: string }> => {
  const r = await gw.api('POST', '/v1/agents', { body: agentId ? { agentId } : {} })
  if (r.status !== 201) throw new Error(`create agent: ${r.status} ${r.text}`)
  return r.body
}

const a = await created('agent-a')
const b = await created('agent-b')
await gw.api('POST', '/v1/wallets', { body: { agentId: 'agent-a' } })
const revoked = await gw.api('POST', '/v1/agents/agent-a/keys')
await gw.api('DELETE', `/v1/keys/${revoked.body.keyId}`)

type Caller = 'none' | 'malformed' | 'basic' | 'revoked' | 'self' | 'other' | 'account'
const keyOf: Record<Caller, string | null> = {
  none: null,
  malformed: 'not-a-key',
  basic: 'rp_live_tooShort',
  revoked: revoked.body.apiKey,
  self: a.apiKey,
  other: b.apiKey,
  account: gw.accountKey,
}

interface Endpoint {
  name: string
  /** Builds the request fresh per call (destructive endpoints need their own target). */
  make(): Promise<{ method: string; path: string; body?: unknown }>
  ok: number
  /** Expected status for agent-a's own key (account-level operations: 403). */
  self: number
}
const endpoints: Endpoint[] = [
  { name: 'POST /v1/agents', make: async () => ({ method: 'POST', path: '/v1/agents', body: {} }), ok: 201, self: 403 },
  { name: 'GET /v1/agents', make: async () => ({ method: 'GET', path: '/v1/agents' }), ok: 200, self: 403 },
  { name: 'GET /v1/agents/<id>', make: async () => ({ method: 'GET', path: '/v1/agents/agent-a' }), ok: 200, self: 403 },
  { name: 'DELETE /v1/agents/<id>', make: async () => ({ method: 'DELETE', path: `/v1/agents/${(await created()).agentId}` }), ok: 204, self: 403 },
  { name: 'POST /v1/agents/<id>/keys', make: async () => ({ method: 'POST', path: '/v1/agents/agent-a/keys' }), ok: 201, self: 403 },
  { name: 'GET /v1/agents/<id>/keys', make: async () => ({ method: 'GET', path: '/v1/agents/agent-a/keys' }), ok: 200, self: 403 },
  { name: 'POST /v1/keys', make: async () => ({ method: 'POST', path: '/v1/keys' }), ok: 201, self: 403 },
  { name: 'GET /v1/keys', make: async () => ({ method: 'GET', path: '/v1/keys' }), ok: 200, self: 403 },
  {
    name: 'DELETE /v1/keys/<keyId>',
    make: async () => ({ method: 'DELETE', path: `/v1/keys/${(await gw.api('POST', '/v1/agents/agent-b/keys')).body.keyId}` }),
    ok: 200,
    self: 403,
  },
  { name: 'GET /v1/policies/<id>', make: async () => ({ method: 'GET', path: '/v1/policies/agent-a' }), ok: 200, self: 200 },
  { name: 'PUT /v1/policies/<id>', make: async () => ({ method: 'PUT', path: '/v1/policies/agent-a', body: { perCallLimit: { usdc: 1 } } }), ok: 200, self: 403 },
  { name: 'POST /v1/wallets', make: async () => ({ method: 'POST', path: '/v1/wallets', body: { agentId: (await created()).agentId } }), ok: 201, self: 403 },
  { name: 'GET /v1/wallets/<id>', make: async () => ({ method: 'GET', path: '/v1/wallets/agent-a' }), ok: 200, self: 200 },
  { name: 'POST /v1/wallets/<id>/faucet', make: async () => ({ method: 'POST', path: '/v1/wallets/agent-a/faucet', body: { usdc: 1 } }), ok: 200, self: 403 },
  { name: 'GET /v1/chain', make: async () => ({ method: 'GET', path: '/v1/chain' }), ok: 200, self: 403 },
  { name: 'GET /v1/transactions?agentId=<id>', make: async () => ({ method: 'GET', path: '/v1/transactions?agentId=agent-a' }), ok: 200, self: 200 },
  {
    name: 'POST /v1/pay',
    // A target that is not listening: callers allowed to pay get upstream_unreachable (502), the others 401/403.
    make: async () => ({ method: 'POST', path: '/v1/pay', body: { agentId: 'agent-a', endpoint: 'http://127.0.0.1:9/x' } }),
    ok: 502,
    self: 502,
  },
]

const expected = (e: Endpoint, c: Caller): [number, string | null] => {
  switch (c) {
    case 'none':
    case 'malformed':
    case 'basic':
    case 'revoked':
      return [401, 'unauthorized']
    case 'self':
      return [e.self, e.self === 403 ? 'forbidden' : null]
    case 'other':
      return [403, 'forbidden']
    case 'account':
      return [e.ok, null]
  }
}

for (const e of endpoints) {
  t.test(e.name, async (t) => {
    for (const c of Object.keys(keyOf) as Caller[]) {
      const req = await e.make()
      const headers: Record<string, string> = c === 'malformed' ? { authorization: 'Token abc' } : {}
      const r = await gw.api(req.method, req.path, { key: c === 'malformed' ? null : keyOf[c], headers, ...(req.body !== undefined ? { body: req.body } : {}) })
      const [status, code] = expected(e, c)
      t.equal(r.status, status, `${c}: status ${status}`)
      if (code) {
        t.equal(r.body?.error, code, `${c}: error ${code}`)
        t.type(r.body?.detail, 'string', `${c}: detail`)
      }
    }
  })
}

t.test('health endpoints need no key', async (t) => {
  t.equal((await gw.api('GET', '/healthz', { key: null })).status, 200)
  const ready = await gw.api('GET', '/readyz', { key: null })
  t.equal(ready.status, 200)
  t.same(ready.body, { status: 'ready', checks: { store: true, chain: true } })
})

t.test('PAYGATE_ACCOUNT_KEY is accepted while set', async (t) => {
  const envKey = `rp_live_${'K'.repeat(40)}`
  const g2 = await startTestGateway({ env: { PAYGATE_ACCOUNT_KEY: envKey } })
  t.teardown(() => g2.close())
  t.equal((await g2.api('GET', '/v1/agents', { key: envKey })).status, 200)
  t.equal((await g2.api('GET', '/v1/agents', { key: `rp_live_${'L'.repeat(40)}` })).status, 401)
  t.equal((await g2.api('GET', '/v1/agents')).status, 200, 'the bootstrap key file works too')
})
