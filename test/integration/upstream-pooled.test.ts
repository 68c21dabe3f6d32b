import t, { type Test } from 'tap'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { createLogger } from '../../src/log/index.js'
import { EgressGuard } from '../../src/net/egress.js'
import { UpstreamError } from '../../src/upstream/errors.js'
import { keepAliveHintMs } from '../../src/upstream/origins.js'
import { pooledHead } from '../../src/upstream/pooled.js'
import { readBody, Upstream } from '../../src/upstream/upstream.js'
import { listenForTest } from '../helpers/listen.js'

// Upstream.send puts body-less GET and HEAD on OriginPool's connections (src/upstream/pooled.ts)
// and everything else on undici. undici sends `connection: keep-alive` with every request and
// the pooled path sends no Connection header, which tells the tests which client sent what.

const log = createLogger('silent')
const egress = new EgressGuard({ allow: ['127.0.0.0/8'], deny: [], log })

interface Seen {
  method: string
  url: string
  headers: IncomingMessage['headers']
  socketPort: number
}

async function target(t: Test, answer: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ base: string; seen: Seen[] }> {
  const seen: Seen[] = []
  const s = createServer((req, res) => {
    seen.push({ method: req.method!, url: req.url!, headers: req.headers, socketPort: req.socket.remotePort! })
    req.resume()
    req.on('end', () => answer(req, res))
  })
  const port = await listenForTest(t, s)
  return { base: `http://127.0.0.1:${port}`, seen }
}

function upstreamFor(t: Test, timeoutMs = 30_000): Upstream {
  const up = new Upstream(null, egress, timeoutMs)
  t.teardown(() => up.close())
  return up
}

t.test('pooledHead writes plain fields as they are, and leaves anything else to undici', async (t) => {
  t.equal(
    pooledHead('GET', '/a?b=1', 'x.test:8080', { accept: 'application/json', 'X-Payment': 'eyJ4' }),
    'GET /a?b=1 HTTP/1.1\r\nhost: x.test:8080\r\naccept: application/json\r\nX-Payment: eyJ4\r\n\r\n',
  )
  t.equal(pooledHead('GET', '/', 'x.test', { 'x-a': 'one\r\nx-injected: two' }), null, 'a CR LF in a value')
  t.equal(pooledHead('GET', '/', 'x.test', { 'x-a': 'nul\u0000' }), null, 'a NUL in a value')
  t.equal(pooledHead('GET', '/', 'x.test', { 'bad name': 'v' }), null, 'a name that is not a token')
  for (const name of ['Host', 'connection', 'Transfer-Encoding', 'content-length', 'expect', 'upgrade', 'keep-alive', 'te', 'trailer', 'proxy-connection']) {
    t.equal(pooledHead('GET', '/', 'x.test', { [name]: 'v' }), null, `${name} is not written on this path`)
  }
  t.equal(pooledHead('GET', '/', 'x.test', { 'x-latin': 'caf\u00e9' }), 'GET / HTTP/1.1\r\nhost: x.test\r\nx-latin: caf\u00e9\r\n\r\n', 'obs-text as undici sends it')
})

t.test('a body-less GET goes on a pooled keep-alive connection; a POST with a body and a GET with a Host on undici', async (t) => {
  const { base, seen } = await target(t, (req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'x-twice': ['a', 'b'] })
    res.end(JSON.stringify({ method: req.method }))
  })
  const up = upstreamFor(t)
  for (let i = 0; i < 3; i++) {
    const r = await up.send({ url: `${base}/paid?i=${i}`, method: 'GET', headers: { accept: 'application/json', 'x-payment': `p${i}` }, body: null })
    t.equal(r.status, 200)
    t.equal(r.headers['content-type'], 'application/json')
    t.equal(r.headers['x-twice'], 'a, b', 'repeated fields joined, as the proxy path gives them to the engine')
    t.same(JSON.parse(String(await readBody(r.body, 1024))), { method: 'GET' })
    t.equal((r.body as { complete?: boolean }).complete, true, 'the body says it is complete (collectUpTo reads it at once)')
  }
  t.equal(seen.length, 3)
  for (const [i, s] of seen.entries()) {
    t.equal(s.url, `/paid?i=${i}`)
    t.equal(s.headers.host, base.slice('http://'.length), 'Host from the URL')
    t.equal(s.headers['x-payment'], `p${i}`)
    t.equal(s.headers.connection, undefined, 'the pooled path sent it (no Connection header)')
  }
  t.equal(new Set(seen.map((s) => s.socketPort)).size, 1, 'one connection, kept alive and reused')

  const post = await up.send({ url: `${base}/p`, method: 'POST', headers: { 'content-type': 'application/json' }, body: Buffer.from('{}') })
  await readBody(post.body, 1024)
  t.equal(seen.at(-1)!.headers.connection, 'keep-alive', 'a POST with a body went on undici')
  const withHost = await up.send({ url: `${base}/h`, method: 'GET', headers: { host: 'other.test' }, body: null })
  await readBody(withHost.body, 1024)
  t.equal(seen.at(-1)!.headers.host, 'other.test')
  t.equal(seen.at(-1)!.headers.connection, 'keep-alive', 'a GET with its own Host went on undici')
  const otherTimeout = await up.send({ url: `${base}/t`, method: 'GET', headers: {}, body: null, timeoutMs: 5_000 })
  await readBody(otherTimeout.body, 1024)
  t.equal(seen.at(-1)!.headers.connection, 'keep-alive', 'a GET with a timeout of its own went on undici')
})

t.test('a header that could split the request is never written: undici refuses it as before', async (t) => {
  const { base, seen } = await target(t, (_req, res) => res.end('ok'))
  const up = upstreamFor(t)
  await t.rejects(up.send({ url: `${base}/x`, method: 'GET', headers: { 'x-a': 'v\r\nx-injected: 1' }, body: null }))
  t.equal(seen.length, 0, 'nothing reached the target')
})

t.test('a chunked answer is read without its framing; a HEAD answer has no body', async (t) => {
  const { base } = await target(t, (req, res) => {
    res.writeHead(402, { 'payment-required': 'abc', 'content-type': 'application/json' })
    if (req.method === 'HEAD') return res.end()
    res.write('{"x402Version":')
    setTimeout(() => res.end('2}'), 20)
  })
  const up = upstreamFor(t)
  const r = await up.send({ url: `${base}/c`, method: 'GET', headers: {}, body: null })
  t.equal(r.status, 402)
  t.equal(r.headers['transfer-encoding'], 'chunked')
  t.equal(String(await readBody(r.body, 1024)), '{"x402Version":2}')
  const h = await up.send({ url: `${base}/c`, method: 'HEAD', headers: {}, body: null })
  t.equal(h.status, 402)
  t.equal(h.headers['payment-required'], 'abc')
  t.equal((await readBody(h.body, 1024)).length, 0)
})

t.test('failures: a refused address, a target that does not answer, a closed port, a broken answer', async (t) => {
  const up = upstreamFor(t, 300)
  const denied = await up.send({ url: 'http://169.254.169.254/latest', method: 'GET', headers: {}, body: null }).catch((e: unknown) => e)
  t.equal((denied as { code?: string }).code, 'egress_denied', 'the egress guard refuses a metadata address before any connection')

  const { base: silent } = await target(t, () => {}) // never answers
  const slow = await up.send({ url: `${silent}/s`, method: 'GET', headers: {}, body: null }).catch((e: unknown) => e)
  t.ok(slow instanceof UpstreamError && slow.kind === 'timeout', 'no answer within the limit is a timeout')

  const s = createServer()
  const closedPort = await listenForTest(t, s)
  await new Promise<void>((r) => s.close(() => r()))
  const refused = await up.send({ url: `http://127.0.0.1:${closedPort}/`, method: 'GET', headers: {}, body: null }).catch((e: unknown) => e)
  t.ok(refused instanceof UpstreamError && refused.kind === 'network', 'a refused connection is a network failure')

  const { createServer: rawServer } = await import('node:net')
  const broken = rawServer((c) => c.once('data', () => c.end('HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab')))
  const brokenPort = await listenForTest(t, broken as unknown as import('node:http').Server)
  const bad = await up.send({ url: `http://127.0.0.1:${brokenPort}/`, method: 'GET', headers: {}, body: null }).catch((e: unknown) => e)
  t.ok(bad instanceof UpstreamError && bad.kind === 'network', 'an answer with conflicting lengths is refused, not read')
})

t.test('a body cut off mid-way errors on its reader', async (t) => {
  const { createServer: rawServer } = await import('node:net')
  const s = rawServer((c) => c.once('data', () => c.end('HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part')))
  const port = await listenForTest(t, s as unknown as import('node:http').Server)
  const up = upstreamFor(t)
  const r = await up.send({ url: `http://127.0.0.1:${port}/`, method: 'GET', headers: {}, body: null })
  t.equal(r.status, 200)
  await t.rejects(readBody(r.body, 1024), 'the reader sees the failure')
})

t.test("a connection is reused only within the target's Keep-Alive time, less a second", async (t) => {
  t.equal(keepAliveHintMs('timeout=5'), 5000)
  t.equal(keepAliveHintMs('max=100, timeout=30'), 30_000)
  t.equal(keepAliveHintMs('Timeout = 2; max=5'), 2000)
  t.equal(keepAliveHintMs('max=100'), null)
  t.equal(keepAliveHintMs(undefined), null)

  const open = async (keepAliveMs: number) => {
    const seen: number[] = []
    const s = createServer((req, res) => {
      seen.push(req.socket.remotePort!)
      res.end('ok')
    })
    s.keepAliveTimeout = keepAliveMs // Node announces it as Keep-Alive: timeout=<whole seconds>
    const port = await listenForTest(t, s)
    return { url: `http://127.0.0.1:${port}/`, seen }
  }
  const up = upstreamFor(t)
  const get = async (url: string) => {
    const r = await up.send({ url, method: 'GET', headers: {}, body: null })
    t.equal(r.headers['keep-alive'] !== undefined, true, 'the target announced its keep-alive time')
    t.equal(String(await readBody(r.body, 64)), 'ok')
  }

  const two = await open(2500) // timeout=2: reused for up to 1 s
  await get(two.url)
  await get(two.url)
  t.equal(two.seen[0], two.seen[1], 'reused at once')
  await new Promise((r) => setTimeout(r, 1200))
  await get(two.url)
  t.not(two.seen[2], two.seen[1], 'idle past the time less a second: a new connection, no failure')

  const one = await open(1000) // timeout=1: not worth keeping
  await get(one.url)
  await get(one.url)
  t.not(one.seen[0], one.seen[1], 'a one-second keep-alive is not reused')
})
