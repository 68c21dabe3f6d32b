import t from 'tap'
import { createServer } from 'node:http'
import { startTestGateway } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'
import { basic, rawExchange } from './raw.js'

/**
 * docs/proxy.md: "A request the proxy's HTTP parser refuses gets the same JSON and
 * X-Paygate-Error: invalid_request (431 for a head over 16 KiB ...)". A bodiless GET whose
 * head (17 KiB) arrived in one read went out on the fast path to the target instead: the
 * fast path checked the size only while the head was still incomplete. The target here
 * takes heads up to 64 KiB and counts what reaches it.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const proxyPort = Number(new URL(gw.gw.proxyUrl).port)
const agent = (await gw.api('POST', '/v1/agents', { body: { agentId: 'heads' } })).body as { agentId: string; apiKey: string }
const auth = basic(agent.agentId, agent.apiKey)
let reached = 0
const target = createServer({ maxHeaderSize: 64 * 1024 }, (_req, res) => {
  reached++
  res.end('ok')
})
const port = await listenForTest(t, target)
const pad = 'a'.repeat(17 * 1024)

t.test('a 17 KiB head in one write, absolute-form: 431 from Paygate, the target never sees it', async (t) => {
  const r = await rawExchange(proxyPort, [`GET http://127.0.0.1:${port}/x HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nProxy-Authorization: ${auth}\r\nX-Pad: ${pad}\r\n\r\n`])
  t.equal(r.status, 431)
  t.equal(r.headers['x-paygate-error'], 'invalid_request')
  t.same(JSON.parse(r.body || 'null')?.error, 'invalid_request')
  t.equal(reached, 0, 'nothing reached the target')
})

t.test('the same inside a plain-HTTP CONNECT tunnel', async (t) => {
  const r = await rawExchange(
    proxyPort,
    [`CONNECT 127.0.0.1:${port} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nProxy-Authorization: ${auth}\r\n\r\n`, `GET /x HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nX-Pad: ${pad}\r\n\r\n`],
    { pauseMs: 50 },
  )
  const second = r.text.slice(r.text.indexOf('\r\n\r\n') + 4)
  t.match(second, /^HTTP\/1\.1 431 /)
  t.match(second, /x-paygate-error: invalid_request/i)
  t.equal(reached, 0, 'nothing reached the target')
})

t.test('a head just under 16 KiB still goes through', async (t) => {
  const r = await rawExchange(proxyPort, [
    `GET http://127.0.0.1:${port}/x HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nProxy-Authorization: ${auth}\r\nConnection: close\r\nX-Pad: ${'a'.repeat(15 * 1024)}\r\n\r\n`,
  ])
  t.equal(r.status, 200)
  t.equal(reached, 1)
})
