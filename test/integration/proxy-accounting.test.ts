import t from 'tap'
import { subscribe, unsubscribe } from 'node:diagnostics_channel'
import { rmSync } from 'node:fs'
import { createServer } from 'node:http'
import { connect } from 'node:net'
import { startTestGateway, tempDir } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'

/** What the metrics read off the proxy: every 407 counted, every request counted and published on `paygate:proxy:request`. */
const dataDir = tempDir()
const gw = await startTestGateway({ dataDir, env: { PAYGATE_PROXY_DEFAULT_AGENT: 'sidecar' } })
t.teardown(async () => {
  await gw.close()
  rmSync(dataDir, { recursive: true, force: true })
})
await gw.api('POST', '/v1/agents', { body: { agentId: 'sidecar' } })
const proxy = new URL(gw.gw.proxyUrl)
const target = `127.0.0.1:${await listenForTest(
  t,
  createServer((_req, res) => res.end('ok')),
)}`
const WRONG = `Proxy-Authorization: Basic ${Buffer.from('sidecar:rp_agent_wrong').toString('base64')}\r\n`

/** One request on a new connection; resolves with what came back once the connection closes or `done` holds. */
function exchange(text: string, done: (got: string) => boolean): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(Number(proxy.port), proxy.hostname, () => s.write(text))
    let got = ''
    const timer = setTimeout(() => {
      s.destroy()
      reject(new Error(`no answer; got ${JSON.stringify(got)}`))
    }, 10_000)
    const finish = (): void => {
      clearTimeout(timer)
      s.destroy()
      resolve(got)
    }
    s.on('data', (d: Buffer) => {
      got += d.toString('latin1')
      if (done(got)) finish()
    })
    s.on('close', finish)
    s.on('error', () => undefined)
  })
}
const whole = (got: string): boolean => got.includes('"detail"') && got.trimEnd().endsWith('}')

t.test('every 407 counts as an auth failure: fast path, CONNECT and an absolute-form upgrade', async (t) => {
  const counters = gw.gw.proxy.counters
  for (const request of [
    `GET http://${target}/ HTTP/1.1\r\nHost: ${target}\r\n${WRONG}\r\n`,
    `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${WRONG}\r\n`,
    `GET ws://${target}/ HTTP/1.1\r\nHost: ${target}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n${WRONG}\r\n`,
  ]) {
    const before = counters.authFailures
    const got = await exchange(request, whole)
    t.match(got, /^HTTP\/1\.1 407 /, request.slice(0, request.indexOf('\r\n')))
    t.match(got, /proxy-authenticate: Basic realm="paygate"/i)
    t.equal(counters.authFailures, before + 1, 'counted once')
  }
  // A 407 is a failed request: each has its access line (the logger writes lines in batches).
  await new Promise((r) => setTimeout(r, 50))
  const denied = gw.logs.filter((l) => l.includes('"msg":"proxy request"') && l.includes('"status":407') && l.includes('"error":"unauthorized"'))
  t.equal(denied.length, 3, 'each logged')
  t.ok(
    denied.some((l) => l.includes('"method":"CONNECT"') && l.includes(`"host":"${target}"`)),
    'with what is known of the request',
  )
  t.ok(
    denied.some((l) => l.includes('"method":"GET"') && l.includes(`"host":"${target}"`)),
    'the fast path too',
  )
})

t.test('a request is counted and published on paygate:proxy:request', async (t) => {
  const seen: unknown[] = []
  const listener = (m: unknown): void => void seen.push(m)
  subscribe('paygate:proxy:request', listener)
  t.teardown(() => unsubscribe('paygate:proxy:request', listener))
  const before = gw.gw.proxy.counters.requests
  const got = await exchange(`GET http://${target}/ HTTP/1.1\r\nHost: ${target}\r\nConnection: close\r\n\r\n`, (g) => g.endsWith('ok'))
  t.match(got, /^HTTP\/1\.1 200 /)
  t.equal(gw.gw.proxy.counters.requests, before + 1)
  t.match(seen, [{ agentId: 'sidecar', method: 'GET', status: 200, paid: null, error: undefined, durationMs: Number }])
})
