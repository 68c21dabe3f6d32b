import t, { type Test } from 'tap'
import { readFileSync } from 'node:fs'
import { request } from 'node:http'
import { connect } from 'node:net'
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
  // A policy PUT creates an unknown agent, but only with a valid body.
  const arr = await gw.api('PUT', '/v1/policies/x', { body: [1, 2] })
  t.same([arr.status, arr.body.field], [400, 'body'])
  t.equal((await gw.api('GET', '/v1/agents/x')).status, 404, 'a refused PUT creates no agent')
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

t.test('under /v1 a request without a valid key gets 401 before any 404 or 405; openapi.json and ca.pem stay public', async (t) => {
  for (const key of [null, `rp_live_${'Z'.repeat(40)}`]) {
    for (const [method, path] of [
      ['GET', '/v1/nothing'],
      ['PATCH', '/v1/policies/x'],
      ['DELETE', '/v1/chain'],
      ['GET', '/v1'],
      ['GET', '/v1/agents/%E0%A4%A'],
    ]) {
      const r = await gw.api(method!, path!, { key })
      t.same([r.status, r.body.error], [401, 'unauthorized'], `${method} ${path} with ${key ? 'an unknown key' : 'no key'}`)
    }
  }
  const doc = await gw.api('GET', '/v1/openapi.json', { key: null })
  t.equal(doc.status, 200)
  t.match(doc.headers.get('content-type'), /^application\/json/)
  t.equal(doc.body.openapi, '3.1.0')
  t.same(doc.body, JSON.parse(readFileSync(new URL('../../docs/openapi.json', import.meta.url), 'utf8')), 'docs/openapi.json as it is')
  t.ok(doc.body.paths['/v1/openapi.json'], 'the document lists itself')
  t.equal((await gw.api('GET', '/v1/ca.pem', { key: null })).status, 200)
  const wrong = await gw.api('POST', '/v1/ca.pem', { key: null })
  t.same([wrong.status, wrong.body.error, wrong.headers.get('allow')], [405, 'method_not_allowed', 'GET'], 'a public path answers 405 without a key')
  t.equal((await gw.api('GET', '/healthz', { key: null })).status, 200, 'outside /v1 as before')
  t.equal((await gw.api('GET', '/nothing', { key: null })).status, 404, 'outside /v1 as before')
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

/** Send raw bytes on a new connection; everything the server answers until it closes the connection. */
function raw(data: string): Promise<string> {
  const { hostname, port } = new URL(gw.url)
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    const socket = connect(Number(port), hostname, () => socket.write(data))
    socket.on('data', (d) => chunks.push(d))
    socket.on('error', reject)
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')))
    socket.setTimeout(10_000, () => socket.destroy(new Error('the server did not close the connection')))
  })
}

/** Each HTTP/1.1 response in `text`: status, headers, body. */
function responses(text: string): { status: number; headers: Record<string, string>; body: string }[] {
  const out = []
  while (text) {
    const end = text.indexOf('\r\n\r\n')
    const [statusLine, ...lines] = text.slice(0, end < 0 ? undefined : end).split('\r\n')
    const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]))
    // Without a length (Node's own bare answer) the body runs to the close.
    const length = headers['content-length'] === undefined || end < 0 ? Infinity : Number(headers['content-length'])
    out.push({ status: Number(statusLine!.split(' ')[1]), headers, body: end < 0 ? '' : text.slice(end + 4, end + 4 + length) })
    text = end < 0 || length === Infinity ? '' : text.slice(end + 4 + length)
  }
  return out
}

t.test('requests the HTTP parser refuses get the spec error body, then the connection closes', async (t) => {
  const cases: [string, string, number][] = [
    ['a bad header line', 'GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n', 400],
    ['Content-Length: abc', 'POST /v1/agents HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n', 400],
    ['two Content-Lengths', 'POST /v1/agents HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab', 400],
    ['a bad request line', 'GET /healthz HTTP/9.x\r\nHost: x\r\n\r\n', 400],
    ['headers over the size limit', `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ${'a'.repeat(20_000)}\r\n\r\n`, 431],
  ]
  for (const [what, data, status] of cases) {
    const [res, ...more] = responses(await raw(data))
    t.equal(res?.status, status, what)
    t.match(res?.headers['content-type'], /^application\/json/, `${what}: JSON`)
    t.equal(res?.headers.connection, 'close', `${what}: the connection is closed`)
    const body = JSON.parse(res?.body || 'null')
    t.same(Object.keys(body ?? {}).sort(), ['detail', 'error'], `${what}: {error, detail}`)
    t.equal(body?.error, 'invalid_request', what)
    t.type(body?.detail, 'string')
    noStack(t, res?.body ?? '')
    t.same(more, [], `${what}: nothing else`)
  }
})

t.test('a bad request pipelined behind a good one is answered after it', async (t) => {
  const [first, second, ...more] = responses(await raw('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nBad Header Line\r\n\r\n'))
  t.equal(first?.status, 200, 'the good request is answered in full')
  t.same(JSON.parse(first?.body || 'null'), (await gw.api('GET', '/healthz', { key: null })).body)
  t.equal(second?.status, 400)
  t.equal(JSON.parse(second?.body || 'null')?.error, 'invalid_request')
  t.same(more, [])
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
  t.equal((await g.api('GET', '/v1/agents', { key: `rp_live_${'z'.repeat(40)}` })).status, 401, 'bad keys are refused before the limiter')
})
