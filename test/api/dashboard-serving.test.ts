import t from 'tap'
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs'
import { request } from 'node:http'
import { join } from 'node:path'
import { DashboardAssets, DASHBOARD_CSP } from '../../src/api/dashboard.js'
import type { PaygateError } from '../../src/errors/index.js'
import { newTxId, type TxRecord } from '../../src/ledger/transactions.js'
import { startTestGateway, testDir } from '../helpers/gateway.js'

/** A built dashboard in a temp dir, with a secret beside it that no path may reach. */
function fakeBuild(t: Parameters<typeof testDir>[0]): string {
  const top = testDir(t)
  const dir = join(top, 'web')
  mkdirSync(join(dir, 'assets'), { recursive: true })
  writeFileSync(join(dir, 'index.html'), '<!doctype html><title>x</title>')
  writeFileSync(join(dir, 'assets', 'index-abc123.js'), 'console.log(1)')
  writeFileSync(join(dir, 'assets', 'index-abc123.css'), 'body{}')
  writeFileSync(join(dir, 'assets', 'notes.unknownext'), 'not served')
  writeFileSync(join(top, 'secret.txt'), 'SECRET')
  symlinkSync(join(top, 'secret.txt'), join(dir, 'assets', 'link.txt'))
  return dir
}

/** A GET with the path sent exactly as given (fetch and URL would normalise `..`). */
function rawGet(base: string, path: string): Promise<{ status: number; body: string; headers: Record<string, unknown> }> {
  const u = new URL(base)
  return new Promise((resolve, reject) => {
    const req = request({ host: u.hostname, port: u.port, path, method: 'GET' }, (res) => {
      let body = ''
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, headers: res.headers }))
    })
    req.on('error', reject)
    req.end()
  })
}

t.test('the asset table: content types, caching, security headers, no traversal', async (t) => {
  const assets = new DashboardAssets(fakeBuild(t))
  t.ok(assets.built)
  const index = assets.answer('GET', '/ui/')
  t.equal(index.status, 200)
  t.equal(index.raw?.contentType, 'text/html; charset=utf-8')
  t.equal(index.headers?.['cache-control'], 'no-cache', 'index.html is revalidated')
  t.equal(index.headers?.['content-security-policy'], DASHBOARD_CSP)
  t.equal(index.headers?.['x-content-type-options'], 'nosniff')
  const js = assets.answer('GET', '/ui/assets/index-abc123.js')
  t.equal(js.raw?.contentType, 'text/javascript; charset=utf-8')
  t.equal(js.headers?.['cache-control'], 'public, max-age=31536000, immutable', 'hashed assets are immutable')
  t.equal(assets.answer('GET', '/ui/assets/index-abc123.css').raw?.contentType, 'text/css; charset=utf-8')
  t.equal(assets.answer('HEAD', '/ui/assets/index-abc123.js').raw?.data.length, 0, 'HEAD has no body')
  t.same(assets.answer('GET', '/').headers?.location, '/ui/')
  t.same(assets.answer('GET', '/ui').headers?.location, '/ui/')
  for (const p of [
    '/ui/../secret.txt',
    '/ui/assets/../../secret.txt',
    '/ui/%2e%2e/secret.txt',
    '/ui/..%2fsecret.txt',
    '/ui/assets/link.txt',
    '/ui/assets/notes.unknownext',
    '/ui//etc/passwd',
    '/ui/assets',
  ]) {
    t.throws(() => assets.answer('GET', p), { code: 'not_found' }, p)
  }
  t.throws(() => assets.answer('POST', '/ui/'), { code: 'method_not_allowed' })
  t.match(DASHBOARD_CSP, /default-src 'self'/)
  t.notMatch(DASHBOARD_CSP, /unsafe|\*|https?:|data:/, 'nothing but self')
})

t.test('the dashboard owns only / and /ui/…: /v1, /metrics, /healthz, /readyz stay the API', async (t) => {
  for (const p of ['/', '/ui', '/ui/', '/ui/assets/x.js']) t.ok(DashboardAssets.owns(p), p)
  for (const p of ['/v1/transactions', '/metrics', '/healthz', '/readyz', '/uix', '/v1/ui/']) t.notOk(DashboardAssets.owns(p), p)
})

t.test('an unbuilt dashboard says so', async (t) => {
  const assets = new DashboardAssets(join(testDir(t), 'missing'))
  t.notOk(assets.built)
  const e = t.throws(() => assets.answer('GET', '/ui/')) as PaygateError
  t.match(e.message, /not built: run npm run build/)
})

t.test('through the API port: served, traversal refused, API untouched', async (t) => {
  const gw = await startTestGateway({ options: { dashboardDir: fakeBuild(t) } })
  t.teardown(() => gw.close())
  const index = await rawGet(gw.url, '/ui/')
  t.equal(index.status, 200)
  t.equal(index.body, '<!doctype html><title>x</title>')
  t.equal(index.headers['content-security-policy'], DASHBOARD_CSP)
  for (const p of ['/ui/../secret.txt', '/ui/%2e%2e/secret.txt', '/ui/..%2f..%2fsecret.txt', '/ui/assets/link.txt', '/ui/assets/%2e%2e/%2e%2e/secret.txt']) {
    const r = await rawGet(gw.url, p)
    t.not(r.status, 200, p)
    t.notMatch(r.body, /SECRET/, p)
  }
  t.equal((await rawGet(gw.url, '/healthz')).status, 200)
  const metrics = await rawGet(gw.url, '/metrics')
  t.equal(metrics.status, 200, '/metrics is the Prometheus route')
  t.match(metrics.headers['content-type'], /^text\/plain/, '/metrics is not the dashboard')
  t.equal((await gw.api('GET', '/v1/me')).body.kind, 'account')
})

t.test('api.dashboard=false: no dashboard', async (t) => {
  const gw = await startTestGateway({ env: { PAYGATE_API_DASHBOARD: 'false' }, options: { dashboardDir: fakeBuild(t) } })
  t.teardown(() => gw.close())
  t.equal((await rawGet(gw.url, '/ui/')).status, 404)
})

t.test('GET /v1/me and GET /v1/health', async (t) => {
  const gw = await startTestGateway()
  t.teardown(() => gw.close())
  const agentKey = (await gw.api('POST', '/v1/agents', { body: { agentId: 'me-bot' } })).body.apiKey
  t.match((await gw.api('GET', '/v1/me')).body, { kind: 'account', keyId: /^key_/ })
  t.match((await gw.api('GET', '/v1/me', { key: agentKey })).body, { kind: 'agent', agentId: 'me-bot', keyId: /^key_/ })
  t.equal((await gw.api('GET', '/v1/me', { key: null })).status, 401)
  const h = await gw.api('GET', '/v1/health')
  t.equal(h.status, 200)
  t.match(h.body, { status: 'ok', store: { ok: true, status: 'open' }, chain: { ok: true, network: String, embedded: true, blockNumber: Number }, outbox: { ok: true, pending: 0, oldestWaitS: null } })
  t.equal((await gw.api('GET', '/v1/health', { key: agentKey })).status, 403)
})

t.test('GET /v1/transactions filters by protocol and by time', async (t) => {
  const gw = await startTestGateway()
  t.teardown(() => gw.close())
  const base = Date.parse('2026-11-01T00:00:00Z')
  const rec = (i: number, protocol: 'x402' | 'mpp', agentId = 'a1'): TxRecord => ({
    id: newTxId(base + i * 60_000),
    agentId,
    status: 'paid',
    createdAt: base + i * 60_000,
    updatedAt: base + i * 60_000,
    endpoint: 'http://127.0.0.1:1/paid',
    method: 'GET',
    protocol,
    amount: '1000',
    txHash: null,
    parentTxHash: null,
    depth: 0,
  })
  const recs = [rec(0, 'x402'), rec(1, 'mpp'), rec(2, 'x402'), rec(3, 'mpp', 'a2'), rec(4, 'x402')]
  for (const r of recs) await gw.gw.transactions.put(r)
  const ids = async (q: string) => (await gw.api('GET', `/v1/transactions?${q}`)).body.transactions.map((x: { id: string }) => x.id)
  t.same(await ids('protocol=mpp'), [recs[3]!.id, recs[1]!.id])
  t.same(await ids('protocol=x402&agentId=a1'), [recs[4]!.id, recs[2]!.id, recs[0]!.id])
  t.same(await ids('from=2026-11-01T00:01:00Z&to=2026-11-01T00:03:00Z'), [recs[2]!.id, recs[1]!.id], 'from inclusive, to exclusive')
  t.same(await ids('from=2026-11-01T00:02:00Z&status=paid&agentId=a1'), [recs[4]!.id, recs[2]!.id])
  // Paging with a protocol filter: limit 1 walks every x402 record once.
  const seen: string[] = []
  let cursor = ''
  for (let i = 0; i < 5; i++) {
    const page = (await gw.api('GET', `/v1/transactions?protocol=x402&limit=1${cursor ? `&cursor=${cursor}` : ''}`)).body
    seen.push(...page.transactions.map((x: { id: string }) => x.id))
    if (!page.nextCursor) break
    cursor = page.nextCursor
  }
  t.same(seen, [recs[4]!.id, recs[2]!.id, recs[0]!.id])
  const bad: [string, string][] = [
    ['protocol=card', 'protocol'],
    ['from=yesterday', 'from'],
    ['to=1700000000', 'to'],
    ['from=2026-11-02T00:00:00Z&to=2026-11-01T00:00:00Z', 'to'],
  ]
  for (const [q, field] of bad) {
    const r = await gw.api('GET', `/v1/transactions?${q}`)
    t.same([r.status, r.body.error, r.body.field], [400, 'invalid_request', field], q)
  }
})
