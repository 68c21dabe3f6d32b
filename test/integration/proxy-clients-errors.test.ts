import t, { type Test } from 'tap'
import { execFile } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { createServer as createNetServer, connect as netConnect, type AddressInfo, type Socket } from 'node:net'
import { join } from 'node:path'
import { createServer as createTlsServer } from 'node:tls'
import { promisify } from 'node:util'
import { ProxyAgent, request } from 'undici'
import { CertificateAuthority } from '../../src/proxy/ca.js'
import { BodyFramer, headEnd, parseResponseHead, responseFraming } from '../../src/upstream/http1.js'
import { startTestGateway, tempDir, testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * Answers Paygate makes itself through the proxy carry `X-Paygate-Error` and the error JSON,
 * so an agent can tell them from the target's own: an agent without a wallet, a sidecar
 * default agent that was deleted (both 404 not_found, which a target could answer too),
 * and the refusals made on sockets that left HTTP (407 on CONNECT, a bad CONNECT, a
 * pass-through or WebSocket target that cannot be reached).
 */
const run = promisify(execFile)
const dir = tempDir()
const upstreamCa = await CertificateAuthority.load(join(dir, 'upstream-ca'))
const upstreamCaFile = join(dir, 'upstream-ca.pem')
writeFileSync(upstreamCaFile, upstreamCa.certPem)
const gw = await startTestGateway({
  env: { PAYGATE_CHAIN_CHAIN_ID: '84532', PAYGATE_UPSTREAM_CA_FILE: upstreamCaFile, PAYGATE_PROXY_DEFAULT_AGENT: 'side', PAYGATE_PROXY_PASS_THROUGH: 'localhost' },
})
t.teardown(() => gw.close())
const caPem = (await gw.api('GET', '/v1/ca.pem', { key: null })).text
const caFile = join(dir, 'paygate-ca.pem')
writeFileSync(caFile, caPem)
const proxyPort = Number(new URL(gw.gw.proxyUrl).port)
const { merchantOptions } = await testChain(gw)

const closers: (() => Promise<unknown>)[] = []
t.teardown(async () => {
  for (const c of closers.reverse()) await c()
})

const m = await startV2Merchant(await merchantOptions(5_000n))
closers.push(() => m.close())
// A TLS front for the merchant, certified by the targets' CA (which the gateway trusts).
const front = createTlsServer(upstreamCa.leafFor('127.0.0.1'), (s) => {
  const up = netConnect(Number(new URL(m.url).port), '127.0.0.1')
  s.pipe(up).pipe(s)
  up.on('error', () => s.destroy())
  s.on('error', () => up.destroy())
})
await new Promise<void>((r) => front.listen(0, '127.0.0.1', r))
closers.push(() => new Promise((r) => front.close(r)))
const https = `https://127.0.0.1:${(front.address() as AddressInfo).port}`

/** A loopback port nothing listens on. */
const closedPort = await new Promise<number>((resolve) => {
  const s = createNetServer().listen(0, '127.0.0.1', () => {
    const port = (s.address() as AddressInfo).port
    s.close(() => resolve(port))
  })
})

const basicOf = (agentId: string, key: string): string => `Basic ${Buffer.from(`${agentId}:${key}`).toString('base64')}`
const WRONG = basicOf('nobody', `rp_agent_${'x'.repeat(40)}`)

interface Answer {
  status: number
  headers: Record<string, string | string[]>
  body: string
}

/** One client connection to the proxy port: `first`, then (after a CONNECT's 200 or any other answer) `then`; the last answer. */
async function raw(first: string, then?: string): Promise<Answer> {
  const s: Socket = netConnect(proxyPort, '127.0.0.1')
  s.on('error', () => {})
  t.teardown(() => s.destroy())
  let buf = Buffer.alloc(0)
  let closed = false
  let wake: (() => void) | null = null
  s.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d])
    wake?.()
  })
  s.on('close', () => {
    closed = true
    wake?.()
  })
  const more = (): Promise<void> =>
    new Promise((resolve, reject) => {
      if (closed) return reject(new Error(`closed; have ${JSON.stringify(buf.toString('latin1'))}`))
      const timer = setTimeout(() => reject(new Error(`no complete answer; have ${JSON.stringify(buf.toString('latin1'))}`)), 10_000)
      wake = () => {
        clearTimeout(timer)
        wake = null
        resolve()
      }
    })
  const answer = async (method: string): Promise<Answer> => {
    let end: number
    while ((end = headEnd(buf)) < 0) await more()
    const head = parseResponseHead(buf, end)!
    buf = buf.subarray(end)
    // A CONNECT's 200 starts the tunnel: no body.
    if (method === 'CONNECT' && head.status === 200) return { status: head.status, headers: head.map, body: '' }
    const framer = new BodyFramer(responseFraming(head, method)!, false)
    const parts: Buffer[] = []
    for (;;) {
      const stop = framer.feed(buf)
      if (stop >= 0) {
        parts.push(buf.subarray(0, stop))
        buf = buf.subarray(stop)
        break
      }
      parts.push(buf)
      buf = Buffer.alloc(0)
      if (closed) break
      await more()
    }
    return { status: head.status, headers: head.map, body: Buffer.concat(parts).toString() }
  }
  s.write(first)
  const method = first.split(' ')[0]!
  const a = await answer(method)
  if (then === undefined || (method === 'CONNECT' && a.status !== 200)) return a
  s.write(then)
  return answer(then.split(' ')[0]!)
}

/** Paygate's own answer: the status, `X-Paygate-Error` naming the code, and the error JSON. */
function paygates(t: Test, a: { status: number; headers: Record<string, unknown>; body: string }, status: number, code: string, label: string, detail?: RegExp): void {
  t.equal(a.status, status, `${label}: ${status}`)
  t.equal(a.headers['x-paygate-error'], code, `${label}: X-Paygate-Error: ${code}`)
  t.match(JSON.parse(a.body), { error: code, detail: detail ?? String }, `${label}: the error JSON`)
}

t.test('an agent without a wallet: the 404 not_found is marked as Paygate’s, on every path', async (t) => {
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'nowallet' } })).body.apiKey as string
  const auth = basicOf('nowallet', key)
  const detail = /wallet for agent nowallet/
  const agent = new ProxyAgent({ uri: gw.gw.proxyUrl, token: auth, requestTls: { ca: caPem } })
  t.teardown(() => agent.close())
  const settled = m.stats.settlements

  // Intercepted HTTPS: a bodiless GET (fast path in the tunnel), then a POST (Node's server).
  for (const method of ['GET', 'POST'] as const) {
    const r = await request(`${https}/paid`, { dispatcher: agent, method, ...(method === 'POST' ? { body: '{"q":1}', headers: { 'content-type': 'application/json' } } : {}) })
    paygates(t, { status: r.statusCode, headers: r.headers, body: await r.body.text() }, 404, 'not_found', `HTTPS ${method}`, detail)
  }
  // Absolute-form plain HTTP on the proxy port.
  paygates(t, await raw(`GET ${m.url}/paid HTTP/1.1\r\nHost: ${new URL(m.url).host}\r\nProxy-Authorization: ${auth}\r\n\r\n`), 404, 'not_found', 'absolute-form GET', detail)
  // curl, as the README's recipe.
  const { stdout } = await run('curl', ['-s', '-i', '--max-time', '20', '--cacert', caFile, '-x', `http://nowallet:${key}@127.0.0.1:${proxyPort}`, `${https}/paid`])
  t.match(stdout, /^HTTP\/1\.1 404 /m)
  t.match(stdout, /^x-paygate-error: not_found\r$/im, 'curl sees X-Paygate-Error')
  t.equal(m.stats.settlements, settled, 'nothing paid')
})

t.test('a deleted sidecar default agent: requests without credentials get a 404 marked as Paygate’s', async (t) => {
  await gw.api('POST', '/v1/agents', { body: { agentId: 'side' } })
  await gw.api('POST', '/v1/wallets', { body: { agentId: 'side' } })
  const anon = new ProxyAgent({ uri: gw.gw.proxyUrl, requestTls: { ca: caPem } })
  t.teardown(() => anon.close())
  const ok = await request(`${https}/free`, { dispatcher: anon })
  t.equal(ok.statusCode, 200, 'no credentials: the sidecar agent')
  await ok.body.dump()

  t.equal((await gw.api('DELETE', '/v1/agents/side')).status, 204)
  const detail = /agent side does not exist/
  for (const path of ['/free', '/paid']) {
    const r = await request(`${https}${path}`, { dispatcher: anon })
    paygates(t, { status: r.statusCode, headers: r.headers, body: await r.body.text() }, 404, 'not_found', `HTTPS ${path}`, detail)
  }
  paygates(t, await raw(`GET ${m.url}/free HTTP/1.1\r\nHost: ${new URL(m.url).host}\r\n\r\n`), 404, 'not_found', 'absolute-form GET', detail)
  paygates(t, await raw(`POST ${m.url}/free HTTP/1.1\r\nHost: ${new URL(m.url).host}\r\nContent-Length: 2\r\n\r\nhi`), 404, 'not_found', 'absolute-form POST', detail)
  const { stdout } = await run('curl', ['-s', '-i', '--max-time', '20', '--cacert', caFile, '-x', `http://127.0.0.1:${proxyPort}`, `${https}/free`])
  t.match(stdout, /^x-paygate-error: not_found\r$/im, 'curl sees X-Paygate-Error')
})

t.test('Paygate’s own refusals carry X-Paygate-Error and the error JSON, also on CONNECT and upgrades', async (t) => {
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'refused' } })).body.apiKey as string
  const auth = basicOf('refused', key)
  const host = new URL(m.url).host

  // Wrong credentials: 407 on the fast path, on Node's server (a body), and on CONNECT.
  for (const [label, req] of [
    ['absolute-form GET', `GET ${m.url}/free HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: ${WRONG}\r\n\r\n`],
    ['absolute-form POST', `POST ${m.url}/free HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: ${WRONG}\r\nContent-Length: 2\r\n\r\nhi`],
    ['CONNECT', `CONNECT ${host} HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: ${WRONG}\r\n\r\n`],
    ['upgrade', `GET ws://${host}/ws HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: ${WRONG}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n`],
  ] as const) {
    const a = await raw(req)
    paygates(t, a, 407, 'unauthorized', label)
    t.equal(a.headers['proxy-authenticate'], 'Basic realm="paygate"', `${label}: Proxy-Authenticate`)
  }
  // curl exits 56 (the CONNECT failed) and shows the proxy's answer.
  const failed = await run('curl', ['-s', '-i', '--max-time', '20', '--cacert', caFile, '-x', `http://nobody:wrong@127.0.0.1:${proxyPort}`, `${https}/free`]).then(
    () => ({ code: 0, stdout: '' }),
    (e: { code: number; stdout: string }) => e,
  )
  t.equal(failed.code, 56)
  const stdout = failed.stdout
  t.match(stdout, /^HTTP\/1\.1 407 /m)
  t.match(stdout, /^x-paygate-error: unauthorized\r$/im, 'curl sees X-Paygate-Error on the CONNECT 407')

  // A CONNECT target that is not host:port.
  paygates(t, await raw(`CONNECT nohostport HTTP/1.1\r\nHost: nohostport\r\nProxy-Authorization: ${auth}\r\n\r\n`), 400, 'invalid_request', 'CONNECT without a port')
  // A pass-through host (tunnelled untouched) that cannot be reached.
  paygates(t, await raw(`CONNECT localhost:${closedPort} HTTP/1.1\r\nHost: localhost:${closedPort}\r\nProxy-Authorization: ${auth}\r\n\r\n`), 502, 'upstream_unreachable', 'pass-through CONNECT')
  // WebSocket upgrades: an unreachable target, and inside a tunnel another host than the tunnel's.
  paygates(
    t,
    await raw(
      `GET ws://127.0.0.1:${closedPort}/ws HTTP/1.1\r\nHost: 127.0.0.1:${closedPort}\r\nProxy-Authorization: ${auth}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
    ),
    502,
    'upstream_unreachable',
    'upgrade to an unreachable target',
  )
  paygates(
    t,
    await raw(
      `GET ${m.url}/free HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: ${auth}\r\n\r\n`,
      `GET ws://127.0.0.1:${closedPort}/ws HTTP/1.1\r\nHost: 127.0.0.1:${closedPort}\r\nProxy-Authorization: ${auth}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
    ),
    502,
    'upstream_unreachable',
    'upgrade to an unreachable target after an answer on the same connection',
  )
  paygates(
    t,
    await raw(
      `CONNECT ${host} HTTP/1.1\r\nHost: ${host}\r\nProxy-Authorization: ${auth}\r\n\r\n`,
      `GET http://other.test/ws HTTP/1.1\r\nHost: other.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
    ),
    400,
    'invalid_request',
    'upgrade in a tunnel for another host',
  )
})
