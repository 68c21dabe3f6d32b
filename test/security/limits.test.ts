import t from 'tap'
import { createServer } from 'node:http'
import { MAX_JSON_DEPTH } from '../../src/api/http.js'
import { MAX_PAY_BODY_DEPTH } from '../../src/api/routes/pay.js'
import { jsonDepth } from '../../src/util/json-depth.js'
import { startTestGateway } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'
import { basic, chunked, rawExchange } from './raw.js'

const gw = await startTestGateway()
t.teardown(() => gw.close())
const apiPort = Number(new URL(gw.url).port)
const proxyPort = Number(new URL(gw.gw.proxyUrl).port)
const agent = (await gw.api('POST', '/v1/agents', { body: { agentId: 'limits' } })).body as { agentId: string; apiKey: string }

const nested = (depth: number, leaf = '1'): string => '['.repeat(depth) + leaf + ']'.repeat(depth)

t.test('jsonDepth counts nesting without recursion, ignoring brackets in strings', async (t) => {
  t.equal(jsonDepth('1'), 0)
  t.equal(jsonDepth('{"a":[1,{"b":[]}]}'), 4)
  t.equal(jsonDepth('{"a":"[[[[\\"[["}'), 1)
  t.equal(jsonDepth(nested(100_000)), 100_000)
})

t.test('JSON nested 5,000 deep is 400 invalid_request on every route that reads a body, never 500', async (t) => {
  const deep = nested(5000)
  const cases: [string, string, string][] = [
    ['POST', '/v1/agents', `{"agentId":${deep}}`],
    ['PUT', '/v1/policies/limits', `{"blockedDomains":${deep}}`],
    ['POST', '/v1/pay', `{"agentId":"limits","endpoint":"http://127.0.0.1:9/","body":${deep}}`],
    ['POST', '/v1/pay', `{"agentId":"limits","endpoint":"http://127.0.0.1:9/","idempotencyKey":"k1","body":${deep}}`],
    ['POST', '/v1/wallets', `{"agentId":${deep}}`],
  ]
  for (const [method, path, rawBody] of cases) {
    const r = await gw.api(method, path, { rawBody, headers: { 'content-type': 'application/json' } })
    t.same([r.status, r.body?.error, r.body?.field], [400, 'invalid_request', 'body'], `${method} ${path}`)
    t.match(r.body?.detail, /deeper than \d+ levels/)
  }
  t.notOk(
    gw.logs.some((l) => l.includes('"request failed"')),
    'nothing logged as an internal error',
  )
})

t.test('the depth limits: 64 for request bodies, 512 for the body POST /v1/pay sends on', async (t) => {
  const at = await gw.api('POST', '/v1/agents', { rawBody: `{"agentId":${nested(MAX_JSON_DEPTH - 1)}}`, headers: { 'content-type': 'application/json' } })
  t.same([at.status, at.body.field], [400, 'agentId'], `${MAX_JSON_DEPTH} levels are read (and the field then refused)`)
  const over = await gw.api('POST', '/v1/agents', { rawBody: `{"agentId":${nested(MAX_JSON_DEPTH)}}`, headers: { 'content-type': 'application/json' } })
  t.same([over.status, over.body.field], [400, 'body'], `${MAX_JSON_DEPTH + 1} are not`)
  // A closed port: the body is serialized, digested and sent, then the target is unreachable.
  const pay = (depth: number) =>
    gw.api('POST', '/v1/pay', {
      rawBody: `{"agentId":"limits","endpoint":"http://127.0.0.1:9/","method":"POST","idempotencyKey":"d${depth}","body":${nested(depth)}}`,
      headers: { 'content-type': 'application/json' },
    })
  const deepOk = await pay(MAX_PAY_BODY_DEPTH)
  t.same([deepOk.status, deepOk.body.error], [502, 'upstream_unreachable'], `a body ${MAX_PAY_BODY_DEPTH} deep goes on to the target`)
  const tooDeep = await pay(MAX_PAY_BODY_DEPTH + 1)
  t.same([tooDeep.status, tooDeep.body.field], [400, 'body'])
})

t.test('a target answer nested deeper than the limit comes back as text in data', async (t) => {
  const deep = nested(5000)
  const target = createServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(deep))
  const port = await listenForTest(t, target)
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'limits', endpoint: `http://127.0.0.1:${port}/deep` } })
  t.equal(r.status, 200)
  t.equal(r.body?.data, deep)
})

const apiHead = (extra: string): string => `POST /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${gw.accountKey}\r\nContent-Type: application/json\r\n${extra}\r\n`

t.test('a 2.5 MiB chunked body to the API: 413 payload_too_large with the error body, no reset', async (t) => {
  const r = await rawExchange(apiPort, [apiHead('Transfer-Encoding: chunked\r\n'), ...chunked(2.5 * 1024 * 1024)])
  t.equal(r.error, null, 'no TCP reset')
  t.equal(r.status, 413)
  t.same(JSON.parse(r.body || 'null')?.error, 'payload_too_large')
  t.equal(r.headers.connection, 'close')
})

t.test('a 2.5 MiB body with its Content-Length: 413, no reset', async (t) => {
  const n = 2.5 * 1024 * 1024
  const r = await rawExchange(apiPort, [apiHead(`Content-Length: ${n}\r\n`), Buffer.alloc(n, 0x20)])
  t.equal(r.error, null, 'no TCP reset')
  t.same([r.status, JSON.parse(r.body || 'null')?.error], [413, 'payload_too_large'])
})

const pad = 'a'.repeat(200 * 1024)

t.test('a 200 KiB header on the API port: 431 with the error body, no reset', async (t) => {
  const r = await rawExchange(apiPort, [`GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ${pad}\r\n\r\n`])
  t.equal(r.error, null, 'no TCP reset')
  t.equal(r.status, 431)
  t.same(JSON.parse(r.body || 'null')?.error, 'invalid_request')
})

t.test('a 200 KiB header on the proxy port: 431 with X-Paygate-Error and the error body, no reset', async (t) => {
  const auth = basic(agent.agentId, agent.apiKey)
  const r = await rawExchange(proxyPort, [`GET http://127.0.0.1:9/x HTTP/1.1\r\nHost: 127.0.0.1:9\r\nProxy-Authorization: ${auth}\r\nX-Pad: ${pad}\r\n\r\n`])
  t.equal(r.error, null, 'no TCP reset')
  t.equal(r.status, 431)
  t.equal(r.headers['x-paygate-error'], 'invalid_request')
  t.same(JSON.parse(r.body || 'null')?.error, 'invalid_request')
  t.equal(r.headers.connection, 'close')
})

t.test('a 200 KiB header inside a plain-HTTP CONNECT tunnel: 431 the same way', async (t) => {
  const auth = basic(agent.agentId, agent.apiKey)
  const r = await rawExchange(
    proxyPort,
    [`CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nProxy-Authorization: ${auth}\r\n\r\n`, `GET /x HTTP/1.1\r\nHost: 127.0.0.1:9\r\nX-Pad: ${pad}\r\n\r\n`],
    { pauseMs: 50 },
  )
  t.equal(r.error, null, 'no TCP reset')
  const second = r.text.slice(r.text.indexOf('\r\n\r\n') + 4)
  t.match(second, /^HTTP\/1\.1 431 /)
  t.match(second, /x-paygate-error: invalid_request/i)
})
