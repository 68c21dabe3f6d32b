import t from 'tap'
import { createServer } from 'node:http'
import { startTestGateway } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'
import { basic, rawExchange } from './raw.js'

// One second deadlines; the checks below wait at most 15 s for the answer (the old code kept such requests open for minutes).
const gw = await startTestGateway({ env: { PAYGATE_API_REQUEST_TIMEOUT_MS: '1000', PAYGATE_PROXY_BUFFER_TIMEOUT_MS: '1000' } })
t.teardown(() => gw.close())
const apiPort = Number(new URL(gw.url).port)
const proxyPort = Number(new URL(gw.gw.proxyUrl).port)

t.test('an API request whose body stops coming: 408 with the error body, then the connection closes', async (t) => {
  const r = await rawExchange(apiPort, [
    `POST /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${gw.accountKey}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"agentId":`,
  ])
  t.equal(r.status, 408)
  t.same(JSON.parse(r.body || 'null')?.error, 'invalid_request')
  t.equal(r.headers.connection, 'close')
})

t.test('a body dripped a byte at a time is bounded by the same deadline', async (t) => {
  const drip = Array.from({ length: 100 }, () => ' ')
  const r = await rawExchange(
    apiPort,
    [`POST /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${gw.accountKey}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n`, ...drip],
    { pauseMs: 100 },
  )
  t.equal(r.status, 408)
  t.same(JSON.parse(r.body || 'null')?.error, 'invalid_request')
})

t.test('an API request head that never ends: 408 with the error body', async (t) => {
  const r = await rawExchange(apiPort, [`GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\n`])
  t.equal(r.status, 408)
  t.same(JSON.parse(r.body || 'null')?.error, 'invalid_request')
})

t.test('a proxy request whose buffered body stops coming: 408 with X-Paygate-Error, then the connection closes', async (t) => {
  let reached = 0
  const port = await listenForTest(
    t,
    createServer((_req, res) => {
      reached++
      res.end('ok')
    }),
  )
  const agent = (await gw.api('POST', '/v1/agents', { body: { agentId: 'slow-uploader' } })).body
  const r = await rawExchange(proxyPort, [
    `POST http://127.0.0.1:${port}/upload HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nProxy-Authorization: ${basic(agent.agentId, agent.apiKey)}\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nten bytes.`,
  ])
  t.equal(r.status, 408)
  t.equal(r.headers['x-paygate-error'], 'invalid_request')
  t.same(JSON.parse(r.body || 'null')?.error, 'invalid_request')
  t.equal(r.headers.connection, 'close')
  t.equal(reached, 0, 'nothing was sent to the target')
})

t.test('none of it was logged as an error', async (t) => {
  t.same(
    gw.logs.filter((l) => /"level":(50|60)/.test(l)),
    [],
  )
})
