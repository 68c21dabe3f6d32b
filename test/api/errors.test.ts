import t, { type Test } from 'tap'
import { request } from 'node:http'
import { startTestGateway } from '../helpers/gateway.js'

const gw = await startTestGateway({ env: { PAYGATE_API_MAX_BODY_BYTES: '2048' } })
t.teardown(() => gw.close())

const noStack = (t: Test, text: string): void => {
  t.notMatch(text, /\bat [\w.<>]+ \(|node:internal|\.ts:\d+/, 'no stack trace in the body')
}

t.test('malformed JSON and wrong content types are invalid_request', async (t) => {
  const bad = await gw.api('POST', '/v1/agents', { rawBody: '{"agentId":', headers: { 'content-type': 'application/json' } })
  t.same([bad.status, bad.body.error, bad.body.field], [400, 'invalid_request', 'body'])
  noStack(t, bad.text)
  const ct = await gw.api('POST', '/v1/agents', { rawBody: 'agentId=x', headers: { 'content-type': 'application/x-www-form-urlencoded' } })
  t.same([ct.status, ct.body.error, ct.body.field], [400, 'invalid_request', 'content-type'])
  const arr = await gw.api('PUT', '/v1/policies/x', { body: [1, 2] })
  t.equal(arr.status, 404, 'unknown agent checked before the body')
  await gw.api('POST', '/v1/agents', { body: { agentId: 'x' } })
  const arr2 = await gw.api('PUT', '/v1/policies/x', { body: [1, 2] })
  t.same([arr2.status, arr2.body.field], [400, 'body'])
  const charset = await gw.api('POST', '/v1/agents', { rawBody: '{"agentId":"cs"}', headers: { 'content-type': 'application/json; charset=utf-8' } })
  t.equal(charset.status, 201, 'charset parameter accepted')
})

t.test('oversized bodies are 413', async (t) => {
  const r = await gw.api('POST', '/v1/agents', { body: { agentId: 'y', pad: 'x'.repeat(5000) } })
  t.same([r.status, r.body.error], [413, 'payload_too_large'])
})

t.test('unknown paths are 404 and wrong methods 405 with Allow', async (t) => {
  const nf = await gw.api('GET', '/v1/nothing')
  t.same([nf.status, nf.body.error], [404, 'not_found'])
  const m = await gw.api('PATCH', '/v1/policies/x', { body: {} })
  t.same([m.status, m.body.error], [405, 'method_not_allowed'])
  t.equal(m.headers.get('allow'), 'GET, PUT')
  const enc = await gw.api('GET', '/v1/agents/%E0%A4%A')
  t.same([enc.status, enc.body.error], [400, 'invalid_request'])
})

t.test('responses are JSON, never cached, and the error body has the spec shape', async (t) => {
  const r = await gw.api('GET', '/v1/agents', { key: null })
  t.match(r.headers.get('content-type'), /^application\/json/)
  t.equal(r.headers.get('cache-control'), 'no-store')
  t.same(Object.keys(r.body).sort(), ['detail', 'error'])
})

t.test('a raw request with an absurd target still gets a JSON error', async (t) => {
  const addr = new URL(gw.url)
  const status = await new Promise<number>((resolve, reject) => {
    const req = request({ host: addr.hostname, port: addr.port, path: '//[bad', method: 'GET' }, (res) => {
      res.resume()
      resolve(res.statusCode ?? 0)
    })
    req.on('error', reject)
    req.end()
  })
  t.ok(status === 400 || status === 404, `status ${status}`)
})

t.test('account API rate limit: 100 concurrent calls pass with the defaults', async (t) => {
  const results = await Promise.all(Array.from({ length: 100 }, () => gw.api('GET', '/v1/agents')))
  t.same(new Set(results.map((r) => r.status)), new Set([200]))
})

t.test('over the configured rate: 429 rate_limited with retryAfter and Retry-After', async (t) => {
  const g = await startTestGateway({ env: { PAYGATE_API_RATE_LIMIT_PER_MINUTE: '60', PAYGATE_API_RATE_LIMIT_BURST: '5' } })
  t.teardown(() => g.close())
  const results = await Promise.all(Array.from({ length: 8 }, () => g.api('GET', '/v1/agents')))
  const limited = results.filter((r) => r.status === 429)
  t.equal(results.filter((r) => r.status === 200).length, 5)
  t.equal(limited.length, 3)
  t.equal(limited[0]!.body.error, 'rate_limited')
  t.type(limited[0]!.body.retryAfter, 'number')
  t.ok(limited[0]!.body.retryAfter >= 1)
  t.equal(limited[0]!.headers.get('retry-after'), String(limited[0]!.body.retryAfter))
  t.equal((await g.api('GET', '/healthz', { key: null })).status, 200, 'health is never limited')
  t.equal((await g.api('GET', '/v1/agents', { key: 'rp_live_' + 'z'.repeat(40) })).status, 401, 'bad keys are refused before the limiter')
})
