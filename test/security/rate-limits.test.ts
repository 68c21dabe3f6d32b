import t, { type Test } from 'tap'
import { ApiRateLimits, type RateLimitSettings } from '../../src/api/rate-limit.js'
import type { Identity } from '../../src/agents/registry.js'
import { isPaygateError } from '../../src/errors/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { startTestGateway, type ApiResult, type TestGateway } from '../helpers/gateway.js'

const settings = (over: Partial<RateLimitSettings> = {}): RateLimitSettings => ({
  perMinute: 60,
  burst: 100,
  perKey: { perMinute: 60, burst: 50 },
  accountReservePercent: 20,
  unauthenticated: { perMinute: 60, burst: 5 },
  ...over,
})
const agent = (keyId: string): Identity => ({ kind: 'agent', keyId, agentId: keyId })
const account = (keyId: string): Identity => ({ kind: 'account', keyId })

/** 'ok', or the 429's detail. */
const tryAdmit = (l: ApiRateLimits, id: Identity): string => {
  try {
    l.admit(id)
    return 'ok'
  } catch (e) {
    if (!isPaygateError(e) || e.code !== 'rate_limited') throw e
    return e.detail
  }
}

t.test('each key has its own bucket within the account bucket', async (t) => {
  const clock = new ManualClock()
  const l = new ApiRateLimits(settings(), clock)
  const a = Array.from({ length: 60 }, () => tryAdmit(l, agent('a')))
  t.equal(a.filter((r) => r === 'ok').length, 50, 'the flooding key gets its own burst, no more')
  t.match(a.at(-1), /rate limit of this key exceeded/)
  t.equal(tryAdmit(l, agent('b')), 'ok', 'another agent key is not touched by it')
  t.equal(tryAdmit(l, account('acct')), 'ok', 'nor is the account key')
  clock.advance(1000)
  t.equal(tryAdmit(l, agent('a')), 'ok', 'refilled at its per-minute rate')
})

t.test('agent keys leave the reserve of the account bucket to account keys', async (t) => {
  const clock = new ManualClock()
  const l = new ApiRateLimits(settings(), clock)
  t.equal(l.reserve, 20)
  const agents = ['a', 'b', 'c'].flatMap((k) => Array.from({ length: 50 }, () => tryAdmit(l, agent(k))))
  t.equal(agents.filter((r) => r === 'ok').length, 80, 'agent keys together take the account burst down to the reserve')
  t.match(agents.at(-1), /account API rate limit exceeded/)
  const acct = Array.from({ length: 25 }, () => tryAdmit(l, account('acct')))
  t.equal(acct.filter((r) => r === 'ok').length, 20, 'the account key takes the reserve')
  t.match(acct.at(-1), /account API rate limit exceeded/, 'the account-wide limit still holds')
})

t.test('failed keys count per client address only', async (t) => {
  const clock = new ManualClock()
  const l = new ApiRateLimits(settings(), clock)
  for (let i = 0; i < 5; i++) l.refused('10.0.0.1')
  t.throws(() => l.refused('10.0.0.1'), { code: 'rate_limited' })
  t.doesNotThrow(() => l.refused('10.0.0.2'), 'another address has its own budget')
  t.equal(tryAdmit(l, agent('a')), 'ok', 'valid keys are not touched')
})

/** Calls until `count` are done or `ms` have passed, `workers` at a time; the statuses seen. */
async function flood(call: () => Promise<ApiResult>, count: number, ms: number, workers: number): Promise<number[]> {
  const statuses: number[] = []
  const until = Date.now() + ms
  let started = 0
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (started < count && Date.now() < until) {
        started++
        statuses.push((await call()).status)
      }
    }),
  )
  return statuses
}

/** Calls one at a time while `busy` holds (and at least `min`), the statuses seen. */
async function alongside(call: () => Promise<ApiResult>, busy: () => boolean, min: number, max: number): Promise<number[]> {
  const statuses: number[] = []
  while ((busy() || statuses.length < min) && statuses.length < max) statuses.push((await call()).status)
  return statuses
}

const share429 = (s: number[]): number => s.filter((x) => x === 429).length / s.length

async function floodGateway(t: Test, env: Record<string, string>): Promise<{ gw: TestGateway; flooder: { apiKey: string; keyId: string }; other: { apiKey: string } }> {
  const gw = await startTestGateway({ env })
  t.teardown(() => gw.close())
  const flooder = (await gw.api('POST', '/v1/agents', { body: { agentId: 'flooder' } })).body
  const other = (await gw.api('POST', '/v1/agents', { body: { agentId: 'other' } })).body
  return { gw, flooder, other }
}

t.test('an agent-key flood: the account key and another agent key keep working, the flooding key gets 429', async (t) => {
  // Per key 100 at once + 5/s: in at most 10 s the flooder takes at most 150 of the account's
  // 1000 (+100/s), and the others at most 150 each, so their calls never meet the reserve (200).
  const { gw, flooder, other } = await floodGateway(t, { PAYGATE_API_RATE_LIMIT_PER_KEY_PER_MINUTE: '300', PAYGATE_API_RATE_LIMIT_PER_KEY_BURST: '100' })
  let flooding = true
  const [flood1, acct, agentB] = await Promise.all([
    flood(() => gw.api('GET', '/v1/policies/flooder', { key: flooder.apiKey }), 600, 10_000, 8).finally(() => (flooding = false)),
    alongside(
      () => gw.api('GET', '/v1/agents?limit=1'),
      () => flooding,
      20,
      100,
    ),
    alongside(
      () => gw.api('GET', '/v1/policies/other', { key: other.apiKey }),
      () => flooding,
      20,
      100,
    ),
  ])
  t.ok(flood1.includes(429), `the flooding key got 429 (${flood1.filter((s) => s === 429).length} of ${flood1.length})`)
  t.ok(share429(acct) < 0.01, `account key: ${acct.filter((s) => s === 429).length} 429s of ${acct.length}`)
  t.ok(share429(agentB) < 0.01, `other agent key: ${agentB.filter((s) => s === 429).length} 429s of ${agentB.length}`)
  t.same(new Set([...acct, ...agentB]), new Set([200]))
  const revoke = await gw.api('DELETE', `/v1/keys/${flooder.keyId}`)
  t.equal(revoke.status, 200, 'the operator revokes the flooding key')
  t.equal((await gw.api('GET', '/v1/policies/flooder', { key: flooder.apiKey })).status, 401)
})

t.test('a flood of bad keys from one address: 429 for them, never for valid keys', async (t) => {
  const { gw, other } = await floodGateway(t, { PAYGATE_API_RATE_LIMIT_UNAUTHENTICATED_PER_MINUTE: '60', PAYGATE_API_RATE_LIMIT_UNAUTHENTICATED_BURST: '20' })
  let flooding = true
  const bad = `rp_agent_${'z'.repeat(40)}`
  const [refused, acct, agentB] = await Promise.all([
    flood(() => gw.api('GET', '/v1/policies/other', { key: bad }), 300, 10_000, 8).finally(() => (flooding = false)),
    alongside(
      () => gw.api('GET', '/v1/agents?limit=1'),
      () => flooding,
      20,
      150,
    ),
    alongside(
      () => gw.api('GET', '/v1/policies/other', { key: other.apiKey }),
      () => flooding,
      20,
      150,
    ),
  ])
  t.ok(refused.includes(401) && refused.includes(429), 'bad keys: 401, then 429 once over the budget')
  t.same(new Set([...acct, ...agentB]), new Set([200]), 'valid keys from the same address are never limited by it')
  // The address's bucket refills at one a second, so on a slow machine a token or
  // two may be back by now; its burst of 20 cannot admit 25 at once.
  const after = await Promise.all(Array.from({ length: 25 }, () => gw.api('GET', '/v1/agents', { key: null })))
  const limited = after.find((r) => r.status === 429)
  t.ok(limited, `no key from the flooding address: 429 (${after.filter((r) => r.status === 429).length} of 25)`)
  t.ok(
    after.every((r) => r.status === 429 || r.status === 401),
    'the rest: 401, a refilled token',
  )
  t.equal(limited?.body.error, 'rate_limited')
  t.equal(limited?.headers.get('retry-after'), String(limited?.body.retryAfter))
})
