import t from 'tap'
import { createServer } from 'node:http'
import { join } from 'node:path'
import { ProxyAgent, request } from 'undici'
import { CertificateAuthority } from '../../src/proxy/ca.js'
import { startTestGateway, tempDir } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'
import { tlsFront } from '../helpers/tls-front.js'

/**
 * An HTTPS target whose certificate comes from a CA the system does not trust: the agent's
 * 502 says which key adds that CA (upstream.caFile), on `POST /v1/pay` and through the proxy.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const privateCa = await CertificateAuthority.load(join(tempDir(), 'private-ca'))
const plain = createServer((_req, res) => res.end('{"ok":true}'))
const front = await tlsFront(privateCa, `http://127.0.0.1:${await listenForTest(t, plain)}`)
t.teardown(() => front.close())

const agentKey = (await gw.api('POST', '/v1/agents', { body: { agentId: 'trusting' } })).body.apiKey as string
await gw.api('POST', '/v1/wallets', { body: { agentId: 'trusting' } })

t.test('POST /v1/pay: 502 upstream_unreachable naming upstream.caFile', async (t) => {
  const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'trusting', endpoint: `${front.url}/thing`, method: 'GET' } })
  t.equal(r.status, 502, r.text)
  t.equal(r.body.error, 'upstream_unreachable')
  t.match(r.body.detail, /unable to verify the first certificate/)
  t.match(r.body.detail, /add that CA's PEM file as upstream\.caFile \(PAYGATE_UPSTREAM_CA_FILE\)/)
})

t.test('through the proxy: the same hint in the 502 Paygate answers', async (t) => {
  const proxy = new ProxyAgent({ uri: gw.gw.proxyUrl, token: `Basic ${Buffer.from(`trusting:${agentKey}`).toString('base64')}`, requestTls: { ca: gw.gw.ca.certPem } })
  t.teardown(() => proxy.close())
  const r = await request(`${front.url}/thing`, { dispatcher: proxy })
  t.equal(r.statusCode, 502)
  const body = (await r.body.json()) as { error: string; detail: string }
  t.equal(body.error, 'upstream_unreachable')
  t.match(body.detail, /upstream\.caFile/)
})
