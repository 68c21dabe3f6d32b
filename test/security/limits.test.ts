import t from 'tap'
import { createServer } from 'node:http'
import { MAX_JSON_DEPTH } from '../../src/api/http.js'
import { MAX_PAY_BODY_DEPTH } from '../../src/api/routes/pay.js'
import { jsonDepth } from '../../src/util/json-depth.js'
import { startTestGateway } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'

const gw = await startTestGateway()
t.teardown(() => gw.close())
await gw.api('POST', '/v1/agents', { body: { agentId: 'limits' } })

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
  t.notOk(gw.logs.some((l) => l.includes('"request failed"')), 'nothing logged as an internal error')
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
