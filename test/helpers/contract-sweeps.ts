import type { Test } from 'tap'
import type { Config } from '../../src/config/load.js'
import type { Clock } from '../../src/util/clock.js'
import { contractCaller, send } from './contract-client.js'
import { startTestGateway, type TestGateway } from './gateway.js'
import { Contract, contractKey } from './openapi-contract.js'

/**
 * What the three contract test files share: which paths each drives (together: every path of
 * the document), the gateway they start, and the sweeps every route gets the same way (401
 * without a valid key, 405 for a method the path does not document, 429 past the rate).
 */
export const AREAS = {
  core: [
    '/healthz',
    '/readyz',
    '/v1/ca.pem',
    '/v1/openapi.json',
    '/v1/agents',
    '/v1/agents/{agentId}',
    '/v1/agents/{agentId}/keys',
    '/v1/keys',
    '/v1/keys/{keyId}',
    '/v1/policies/{agentId}',
    '/v1/wallets',
    '/v1/wallets/{agentId}',
    '/v1/wallets/{agentId}/faucet',
    '/v1/chain',
    '/v1/me',
    '/v1/health',
    '/metrics',
  ],
  money: [
    '/v1/pay',
    '/v1/transactions',
    '/v1/transactions/{id}',
    '/v1/transactions/{id}/chain',
    '/v1/transactions/{id}/tree',
    '/v1/agents/invoke',
    '/v1/runs',
    '/v1/runs/{runId}',
    '/v1/agents/{agentId}/metrics',
    '/v1/metrics',
  ],
  ops: [
    '/v1/alerts',
    '/v1/alerts/{alertId}',
    '/v1/alerts/{alertId}/test',
    '/v1/webhooks',
    '/v1/webhooks/{webhookId}',
    '/v1/settings/webhooks',
    '/v1/settings/webhooks/rotate',
    '/v1/deliveries',
    '/v1/deliveries/{deliveryId}',
    '/v1/deliveries/{deliveryId}/retry',
  ],
} as const

export type Area = keyof typeof AREAS

/** Requests without a valid key a client address may send before 429 (refilled at 1 a minute). */
export const UNAUTH_BURST = 10
export const MAX_BODY_BYTES = 16 * 1024

/** A real gateway with small limits the sweeps can reach: 10 unauthenticated requests per address, 16 KiB bodies. */
export async function contractGateway(t: Test, overrides?: (c: Config) => void, clock?: Clock): Promise<{ gw: TestGateway; contract: Contract; call: ReturnType<typeof contractCaller> }> {
  const gw = await startTestGateway({
    ...(clock ? { clock } : {}),
    overrides: (c) => {
      c.api.rateLimit.unauthenticated = { perMinute: 1, burst: UNAUTH_BURST }
      c.api.maxBodyBytes = MAX_BODY_BYTES
      overrides?.(c)
    },
  })
  t.teardown(() => gw.close())
  const contract = new Contract()
  return { gw, contract, call: contractCaller(gw.url, contract) }
}

let nextAddress = 0
/** A loopback source address no request has used yet: its own bucket of requests without a valid key. */
export const freshAddress = (): string => {
  nextAddress++
  return `127.0.${1 + Math.floor(nextAddress / 250)}.${1 + (nextAddress % 250)}`
}

/** A concrete path for a template: every `{param}` filled with a placeholder id. */
export const concrete = (template: string): string => template.replace(/\{[^}]+\}/g, 'contract-x')

/** Whether the document marks an operation public (`security: []`). */
export const isPublic = (contract: Contract, path: string, method: string): boolean => {
  const sec = contract.doc.paths[path][method.toLowerCase()].security
  return Array.isArray(sec) && sec.length === 0
}

const BAD_KEY = `rp_live_${'Z'.repeat(40)}`

/** Every operation of `area` without a key and with an unknown key: 401 `unauthorized` (public ones excepted). */
export async function sweep401(t: Test, gw: TestGateway, contract: Contract, area: Area): Promise<void> {
  const call = contractCaller(gw.url, contract)
  for (const path of AREAS[area]) {
    for (const method of contract.methodsOf(path)) {
      if (isPublic(contract, path, method)) continue
      const from = freshAddress()
      await call(t, { method, path: concrete(path), key: null, from }, 401, 'unauthorized')
      await call(t, { method, path: concrete(path), key: BAD_KEY, from }, 401, 'unauthorized')
    }
  }
}

/** Every path of `area` with a method it does not document: 405 with Allow naming exactly the documented ones. */
export async function sweep405(t: Test, gw: TestGateway, contract: Contract, area: Area): Promise<void> {
  for (const path of AREAS[area]) {
    const methods = contract.methodsOf(path)
    const method = ['PATCH', 'PUT', 'DELETE', 'POST', 'GET'].find((m) => !methods.includes(m))!
    const r = await send(gw.url, { method, path: concrete(path), key: gw.accountKey })
    t.same(contract.check(method, concrete(path), r), [], `${method} ${path}: 405 with Allow: ${methods.join(', ')}`)
  }
}

/**
 * Exhaust one client address's budget of requests without a valid key, then every
 * non-public operation of `area` from it: 429 `rate_limited` with `retryAfter` and Retry-After.
 */
export async function sweep429(t: Test, gw: TestGateway, contract: Contract, area: Area): Promise<void> {
  const call = contractCaller(gw.url, contract)
  const from = freshAddress()
  for (let i = 0; i < UNAUTH_BURST; i++) await send(gw.url, { method: 'GET', path: '/v1/me', key: BAD_KEY, from })
  for (const path of AREAS[area]) {
    for (const method of contract.methodsOf(path)) {
      if (isPublic(contract, path, method)) continue
      const r = await call(t, { method, path: concrete(path), key: BAD_KEY, from }, 429, 'rate_limited')
      t.ok(Number.isInteger(r.body?.retryAfter) && r.headers['retry-after'] === String(r.body.retryAfter), `${method} ${path}: retryAfter ${r.body?.retryAfter}`)
    }
  }
}

/** The area's coverage: every documented (method, path, status) was answered, and no answer seen was undocumented (checked per call). */
export function assertCoverage(t: Test, contract: Contract, area: Area): void {
  const documented = contract.documented(AREAS[area])
  const missing = [...documented].filter((k) => !contract.seen.has(k)).sort()
  const inArea = (k: string): boolean => (AREAS[area] as readonly string[]).includes(k.split(' ')[1]!)
  const extra = [...contract.seen].filter((k) => inArea(k) && !documented.has(k)).sort()
  t.same(missing, [], `${area}: every documented status was answered by a real request`)
  t.same(extra, [], `${area}: every answer seen is a documented status of this area`)
}

export { contractKey }
