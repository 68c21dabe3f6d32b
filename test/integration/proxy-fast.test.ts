import t from 'tap'
import { createServer, type IncomingMessage, type Server } from 'node:http'
import { connect, createServer as createNetServer, type AddressInfo, type Socket } from 'node:net'
import { rmSync } from 'node:fs'
import { Readable } from 'node:stream'
import { BodyFramer } from '../../src/upstream/http1.js'
import type { FastConn } from '../../src/proxy/fast.js'
import { writeAnswer } from '../../src/proxy/relay.js'
import { startTestGateway, tempDir } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'

/**
 * The proxy port's fast path, byte for byte with a raw client: pipelining, framings, the
 * hand-off to Node's parser mid-connection, hop-by-hop fields, stale pooled connections and
 * answers the fast path leaves to the engine's own client.
 */
const dataDir = tempDir()
const gw = await startTestGateway({ dataDir, env: { PAYGATE_PROXY_DEFAULT_AGENT: 'sidecar' } })
t.teardown(async () => {
  await gw.close()
  rmSync(dataDir, { recursive: true, force: true })
})
await gw.api('POST', '/v1/agents', { body: { agentId: 'sidecar' } })
const proxy = new URL(gw.gw.proxyUrl)

const listen = async (s: Server | ReturnType<typeof createNetServer>): Promise<string> => `127.0.0.1:${await listenForTest(t, s)}`

/** Send `text` on one new proxy connection and read until `done` says the answers are all in (or the connection closes). */
function exchange(text: string, done: (got: string) => boolean): Promise<{ got: string; closed: boolean }> {
  return new Promise((resolve, reject) => {
    const s: Socket = connect(Number(proxy.port), proxy.hostname, () => s.write(text))
    let got = ''
    const timer = setTimeout(() => {
      s.destroy()
      reject(new Error(`no complete answer; got ${JSON.stringify(got)}`))
    }, 10_000)
    s.on('data', (d: Buffer) => {
      got += d.toString('latin1')
      if (done(got)) {
        clearTimeout(timer)
        s.destroy()
        resolve({ got, closed: false })
      }
    })
    s.on('close', () => {
      clearTimeout(timer)
      resolve({ got, closed: true })
    })
    s.on('error', reject)
  })
}
const count = (s: string, needle: string): number => s.split(needle).length - 1

const seen: IncomingMessage[] = []
const target = await listen(
  createServer((req, res) => {
    seen.push(req)
    if (req.url === '/chunked') {
      res.writeHead(200, { 'content-type': 'text/plain' })
      res.write('chunk-one;')
      setTimeout(() => res.end('chunk-two'), 5)
      return
    }
    if (req.url === '/hop') {
      res.writeHead(200, { connection: 'x-resp', 'x-resp': 'hop', 'x-kept': 'end', 'content-length': 2 })
      res.end('ok')
      return
    }
    let body = ''
    req.on('data', (c: Buffer) => (body += c.toString()))
    req.on('end', () => {
      const text = `${req.method} ${req.url} ${body}`
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(text) })
      res.end(req.method === 'HEAD' ? undefined : text)
    })
  }),
)

t.test('pipelined requests are answered in order, each in its own framing', async (t) => {
  const text = [
    `GET http://${target}/a HTTP/1.1\r\nHost: ${target}\r\n\r\n`,
    `GET http://${target}/chunked HTTP/1.1\r\nHost: ${target}\r\n\r\n`,
    `HEAD http://${target}/h HTTP/1.1\r\nHost: ${target}\r\n\r\n`,
    `GET http://${target}/b HTTP/1.1\r\nHost: ${target}\r\n\r\n`,
  ].join('')
  const { got } = await exchange(text, (g) => g.includes('GET /b '))
  t.equal(count(got, 'HTTP/1.1 200 OK'), 4)
  const a = got.indexOf('GET /a ')
  const chunked = got.indexOf('chunk-one;')
  const b = got.indexOf('GET /b ')
  t.ok(a >= 0 && a < chunked && chunked < b, 'in order')
  t.match(got, /transfer-encoding: chunked\r\n[\s\S]*a\r\nchunk-one;\r\n9\r\nchunk-two\r\n0\r\n\r\n/i, 'the chunked body relayed in its framing')
  t.notMatch(got, /HEAD \/h/, 'no body for HEAD')
})

t.test('a body later on the same connection goes to Node parser; the connection keeps working', async (t) => {
  const text = [
    `GET http://${target}/first HTTP/1.1\r\nHost: ${target}\r\n\r\n`,
    `POST http://${target}/post HTTP/1.1\r\nHost: ${target}\r\nContent-Length: 5\r\n\r\nhello`,
    `GET http://${target}/after HTTP/1.1\r\nHost: ${target}\r\n\r\n`,
  ].join('')
  const { got } = await exchange(text, (g) => g.includes('GET /after '))
  t.ok(got.indexOf('GET /first ') < got.indexOf('POST /post hello'), 'the POST body reached the target after the first answer')
  t.ok(got.indexOf('POST /post hello') < got.indexOf('GET /after '))
})

t.test('HTTP/1.0 and malformed requests are Node parser business', async (t) => {
  const old = await exchange(`GET http://${target}/old HTTP/1.0\r\n\r\n`, (g) => g.includes('GET /old '))
  t.match(old.got, /^HTTP\/1\.1 200 OK/)
  const bad = await exchange('GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n', () => false)
  t.match(bad.got, /^HTTP\/1\.1 400 /)
  t.ok(bad.closed)
})

t.test('hop-by-hop fields stay on their hop; Paygate headers never reach the target', async (t) => {
  seen.length = 0
  const { got } = await exchange(`GET http://${target}/hop HTTP/1.1\r\nHost: ${target}\r\nConnection: x-secret\r\nX-Secret: 1\r\nX-Paygate-Trace: 2\r\nX-Keep: 3\r\n\r\n`, (g) => g.endsWith('ok'))
  const h = seen[0]!.headers
  t.equal(h['x-secret'], undefined)
  t.equal(h['x-paygate-trace'], undefined)
  t.equal(h['x-keep'], '3')
  t.equal(h.host, target)
  t.notMatch(got, /x-resp/i, 'a field the target listed in Connection is dropped')
  t.match(got, /x-kept: end/i)
})

t.test('Connection: close is honoured after the answer', async (t) => {
  const { got, closed } = await exchange(`GET http://${target}/bye HTTP/1.1\r\nHost: ${target}\r\nConnection: close\r\n\r\n`, () => false)
  t.ok(closed)
  t.match(got, /connection: close/i)
  t.match(got, /GET \/bye $/)
})

t.test('a pooled connection the target dropped is retried once on a new one', async (t) => {
  // The target takes one request per connection and then drops the next without answering.
  let requests = 0
  const perSocket = new WeakMap<object, number>()
  const flaky = createServer((req, res) => {
    requests++
    const n = (perSocket.get(req.socket) ?? 0) + 1
    perSocket.set(req.socket, n)
    if (n > 1) {
      req.socket.destroy()
      return
    }
    res.writeHead(200, { 'content-length': 2 })
    res.end('ok')
  })
  flaky.keepAliveTimeout = 60_000
  const addr = await listen(flaky)
  for (let i = 0; i < 2; i++) {
    const { got } = await exchange(`GET http://${addr}/x HTTP/1.1\r\nHost: ${addr}\r\n\r\n`, (g) => g.endsWith('ok'))
    t.match(got, /^HTTP\/1\.1 200 OK/, `request ${i + 1}`)
  }
  t.equal(requests, 3, 'the dropped attempt, then the retry')
})

t.test('a close-delimited answer is relayed and the agent connection closes after it', async (t) => {
  let requests = 0
  const old = createNetServer((s) => {
    s.once('data', () => {
      requests++
      s.end('HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end')
    })
  })
  const addr = await listen(old)
  const { got, closed } = await exchange(`GET http://${addr}/ HTTP/1.1\r\nHost: ${addr}\r\n\r\n`, () => false)
  t.match(got, /^HTTP\/1\.1 200 OK\r\n/)
  t.match(got, /connection: close\r\n/i)
  t.match(got, /\r\n\r\nuntil the end$/)
  t.ok(closed)
  t.equal(requests, 1, 'sent once')
})

t.test('interim 1xx answers are dropped; the final answer is relayed', async (t) => {
  const early = createNetServer((s) => {
    s.once('data', () => s.write('HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal'))
  })
  const addr = await listen(early)
  const { got } = await exchange(`GET http://${addr}/ HTTP/1.1\r\nHost: ${addr}\r\n\r\n`, (g) => g.endsWith('final'))
  t.match(got, /^HTTP\/1\.1 200 OK\r\n/)
  t.notMatch(got, /103/)
})

t.test('errors for HEAD carry no body (the connection stays in step)', async (t) => {
  const s = createNetServer()
  const addr = await new Promise<string>((r) => s.listen(0, '127.0.0.1', () => r(`127.0.0.1:${(s.address() as AddressInfo).port}`)))
  await new Promise<void>((r) => s.close(() => r()))
  const text = `HEAD http://${addr}/ HTTP/1.1\r\nHost: ${addr}\r\n\r\nGET http://${target}/next HTTP/1.1\r\nHost: ${target}\r\n\r\n`
  const { got } = await exchange(text, (g) => g.includes('GET /next '))
  t.match(got, /^HTTP\/1\.1 502 Bad Gateway\r\n[\s\S]*?\r\n\r\nHTTP\/1\.1 200 OK\r\n/, 'the next answer starts right after the 502 head')
})

t.test('a composed answer is re-framed (chunked) byte for byte under backpressure', async (t) => {
  const SIZE = 4 * 1024 * 1024
  const payload = Buffer.alloc(SIZE)
  for (let i = 0; i < SIZE; i++) payload[i] = i % 251
  const server = createNetServer()
  const addr = await listen(server)
  const accepted = new Promise<Socket>((r) => server.once('connection', r))
  const client = connect(Number(addr.split(':')[1]), '127.0.0.1')
  const socket = await accepted
  const conn = { socket, alive: true, closeAfter: false, onGone: null } as unknown as FastConn
  const framer = new BodyFramer({ kind: 'chunked' }, true)
  let head = ''
  const received = new Promise<Buffer>((resolve) => {
    client.on('data', (d: Buffer) => {
      let body = d
      if (!head) {
        const end = d.indexOf('\r\n\r\n') + 4
        head = d.toString('latin1', 0, end)
        body = d.subarray(end)
      }
      if (framer.feed(body) >= 0) resolve(Buffer.concat(framer.decoded))
    })
  })
  // Slow reader first, so the writer meets a full socket buffer.
  client.pause()
  setTimeout(() => client.resume(), 50)
  const parts = Array.from({ length: 64 }, (_, i) => payload.subarray(i * (SIZE / 64), (i + 1) * (SIZE / 64)))
  await writeAnswer(conn, 'GET', 200, { 'content-type': 'application/octet-stream' }, Readable.from(parts))
  const got = await received
  t.match(head, /transfer-encoding: chunked/)
  t.equal(got.length, SIZE)
  t.ok(got.equals(payload), 'the same bytes')
  client.destroy()
  socket.destroy()
})

t.test('large answers keep every byte: relayed to a slow agent, and a 402 read by the engine', async (t) => {
  // The target's bytes are read into one reused buffer; a patterned body shows any byte that
  // was overwritten before it went out.
  const SIZE = 6 * 1024 * 1024
  const payload = Buffer.alloc(SIZE)
  for (let i = 0; i < SIZE; i++) payload[i] = (i * 7 + (i >> 12)) % 253
  const unpayable = payload.subarray(0, 200 * 1024)
  const bulk = createServer((req, res) => {
    if (req.url === '/402') {
      res.writeHead(402, { 'content-type': 'application/octet-stream', 'content-length': unpayable.length })
      res.end(unpayable)
      return
    }
    const chunked = req.url === '/chunked'
    res.writeHead(200, chunked ? {} : { 'content-length': SIZE })
    let at = 0
    const pump = (): void => {
      while (at < SIZE) {
        const part = payload.subarray(at, at + 100_000)
        at += part.length
        if (!res.write(part)) return void res.once('drain', pump)
      }
      res.end()
    }
    pump()
  })
  const addr = await listen(bulk)
  const fetchRaw = (path: string): Promise<{ head: string; body: Buffer }> =>
    new Promise((resolve, reject) => {
      const s: Socket = connect(Number(proxy.port), proxy.hostname, () => s.write(`GET http://${addr}${path} HTTP/1.1\r\nHost: ${addr}\r\n\r\n`))
      const parts: Buffer[] = []
      let head = ''
      let framer: BodyFramer | null = null
      let rest = Buffer.alloc(0)
      const timer = setTimeout(() => reject(new Error(`no complete answer for ${path}`)), 20_000)
      // A slow reader: the gateway meets a full socket and has to hold the target back.
      s.pause()
      setTimeout(() => s.resume(), 100)
      s.on('data', (d: Buffer) => {
        let body = d
        if (!framer) {
          rest = Buffer.concat([rest, d])
          const end = rest.indexOf('\r\n\r\n')
          if (end < 0) return
          head = rest.toString('latin1', 0, end + 4)
          body = rest.subarray(end + 4)
          const cl = /content-length: (\d+)/i.exec(head)
          framer = new BodyFramer(cl ? { kind: 'length', length: Number(cl[1]) } : { kind: 'chunked' }, !cl)
        }
        const stop = framer.feed(body)
        if (!framer.decoding) parts.push(stop < 0 ? body : body.subarray(0, stop))
        if (stop >= 0) {
          clearTimeout(timer)
          s.destroy()
          resolve({ head, body: framer.decoding ? Buffer.concat(framer.decoded) : Buffer.concat(parts) })
        }
      })
      s.on('error', reject)
    })
  for (const path of ['/length', '/chunked']) {
    const { head, body } = await fetchRaw(path)
    t.match(head, /^HTTP\/1\.1 200 OK\r\n/, path)
    t.equal(body.length, SIZE, `${path}: every byte`)
    t.ok(body.equals(payload), `${path}: the same bytes`)
  }
  const { head, body } = await fetchRaw('/402')
  t.match(head, /^HTTP\/1\.1 402 /)
  t.match(head, /x-paygate-error: payment_protocol_error/i, 'passed through unpaid, saying why')
  t.ok(body.equals(unpayable), 'the 402 body as the target sent it')
})

t.test('an unreachable target is a 502 with the error body', async (t) => {
  const s = createNetServer()
  const addr = await new Promise<string>((r) => s.listen(0, '127.0.0.1', () => r(`127.0.0.1:${(s.address() as AddressInfo).port}`)))
  await new Promise<void>((r) => s.close(() => r()))
  const { got } = await exchange(`GET http://${addr}/ HTTP/1.1\r\nHost: ${addr}\r\n\r\n`, (g) => g.includes('}'))
  t.match(got, /^HTTP\/1\.1 502 Bad Gateway\r\n/)
  t.match(got, /x-paygate-error: upstream_unreachable/)
  t.match(got, /"error":"upstream_unreachable"/)
})
