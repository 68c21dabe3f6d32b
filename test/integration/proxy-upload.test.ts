import t from 'tap'
import { execFile } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { rmSync, writeFileSync } from 'node:fs'
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http'
import { connect as netConnect, createServer as createNetServer, type AddressInfo } from 'node:net'
import { join } from 'node:path'
import { startTestGateway, tempDir } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'

/**
 * Uploads through the proxy with curl, as agents send them: `Expect: 100-continue` (curl's
 * default past 1 MiB), bodies over `proxy.maxBufferBytes` (1 MiB by default) streamed once,
 * chunked bodies, and a large upload to a target that cannot be reached.
 */
const dir = tempDir()
const gw = await startTestGateway()
t.teardown(async () => {
  await gw.close()
  rmSync(dir, { recursive: true, force: true })
})
const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'uploader' } })).body.apiKey as string
const proxyArg = `http://uploader:${key}@127.0.0.1:${new URL(gw.gw.proxyUrl).port}`

const listen = async (s: Server): Promise<string> => `127.0.0.1:${await listenForTest(t, s)}`

/** What the target received, per request. */
const got: { url: string; headers: IncomingHttpHeaders; length: number; sha: string }[] = []
const target = await listen(
  createServer((req, res) => {
    const h = createHash('sha256')
    let length = 0
    req.on('data', (c: Buffer) => {
      h.update(c)
      length += c.length
    })
    req.on('end', () => {
      const rec = { url: req.url ?? '', headers: req.headers, length, sha: h.digest('hex') }
      got.push(rec)
      const text = JSON.stringify({ length, sha: rec.sha })
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) })
      res.end(text)
    })
  }),
)

// A port nothing listens on.
const closed = await new Promise<string>((resolve) => {
  const s = createNetServer()
  s.listen(0, '127.0.0.1', () => {
    const addr = `127.0.0.1:${(s.address() as AddressInfo).port}`
    s.close(() => resolve(addr))
  })
})

const file = (name: string, size: number): { path: string; sha: string } => {
  const data = randomBytes(size)
  const path = join(dir, name)
  writeFileSync(path, data)
  return { path, sha: createHash('sha256').update(data).digest('hex') }
}
const big = file('2mb', 2_000_000)
const small = file('100k', 100_000)

/** curl's exit code, its output and what it wrote with -w. */
function curl(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile('curl', ['-s', '-S', '--max-time', '30', ...args], { maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, stdout, stderr })
    })
  })
}

const upload = (f: { path: string }, url: string, extra: string[] = []): string[] => [
  '-i',
  '-x',
  proxyArg,
  '-H',
  'content-type: application/octet-stream',
  ...extra,
  '--data-binary',
  `@${f.path}`,
  url,
]

t.test('curl uploads with Expect: 100-continue reach the target intact, without Expect', async (t) => {
  const cases: [string, { path: string; sha: string }, string[], number][] = [
    ['2 MB (curl adds Expect), over the buffer limit: streamed once', big, [], 2_000_000],
    ['2 MB chunked, over the buffer limit: streamed once', big, ['-H', 'Transfer-Encoding: chunked'], 2_000_000],
    ['100 kB with Expect, buffered for a paid retry: the engine sends it', small, ['-H', 'Expect: 100-continue'], 100_000],
    ['2 MB inside a CONNECT tunnel (curl -p)', big, ['-p'], 2_000_000],
  ]
  for (const [name, f, extra, size] of cases) {
    got.length = 0
    const r = await curl(upload(f, `http://${target}/upload`, extra))
    t.equal(r.code, 0, `${name}: curl exit 0 ${r.stderr}`)
    t.match(r.stdout, /HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 /, `${name}: 100 Continue, then the target's 200`)
    t.match(r.stdout, new RegExp(`\\{"length":${size},"sha":"${f.sha}"\\}$`), `${name}: every byte`)
    t.equal(got.length, 1, name)
    t.equal(got[0]?.headers.expect, undefined, `${name}: Expect is not forwarded`)
    t.notOk(r.stdout.includes('expect header not supported'), name)
  }
})

t.test('a streamed upload to an unreachable target is a 502, answered before the connection ends', async (t) => {
  const logged = gw.logs.length
  for (const extra of [[], ['-H', 'Transfer-Encoding: chunked'], ['-H', 'Expect:']]) {
    const r = await curl([...upload(big, `http://${closed}/upload`, extra), '-w', '\n%{http_code}'])
    t.equal(r.code, 0, `${extra.join(' ')}: curl exit 0, no reset (${r.stderr})`)
    t.match(r.stdout, /\r\nx-paygate-error: upstream_unreachable\r\n/i, extra.join(' '))
    t.match(r.stdout, /"error":"upstream_unreachable"[^\n]*\n502$/, `${extra.join(' ')}: 502 with the error body`)
  }
  // The small body was always a 502: the same answer whatever the size.
  const r = await curl([...upload(small, `http://${closed}/upload`), '-w', '\n%{http_code}'])
  t.match(r.stdout, /\n502$/)
  const lines = gw.logs.slice(logged)
  t.notOk(
    lines.some((l) => l.includes('"level":"error"') || l.includes('proxy request failed')),
    'nothing logged at error level',
  )
  t.ok(
    lines.some((l) => l.includes('"msg":"proxy request"') && l.includes('"status":502') && l.includes('"error":"upstream_unreachable"')),
    'the access line says 502 upstream_unreachable',
  )

  // The connection stays in step: the rest of the upload is read and dropped, and the next
  // request on it is served. (A raw socket: curl itself may close after an early answer.)
  got.length = 0
  const auth = `Basic ${Buffer.from(`uploader:${key}`).toString('base64')}`
  const body = Buffer.alloc(2 * 1024 * 1024, 'u')
  const sock = netConnect(Number(new URL(gw.gw.proxyUrl).port), '127.0.0.1')
  t.teardown(() => sock.destroy())
  let answers = ''
  sock.on('data', (c: Buffer) => (answers += c.toString('latin1')))
  sock.write(`POST http://${closed}/upload HTTP/1.1\r\nHost: ${closed}\r\nProxy-Authorization: ${auth}\r\nContent-Type: text/plain\r\nContent-Length: ${body.length}\r\n\r\n`)
  sock.write(body)
  sock.write(`GET http://${target}/after HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: ${auth}\r\n\r\n`)
  const until = Date.now() + 10_000
  while (Date.now() < until && !/HTTP\/1\.1 200[\s\S]*\r\n\r\n\{"length":0/.test(answers)) await new Promise((r) => setTimeout(r, 20))
  t.match(answers, /^HTTP\/1\.1 502 [\s\S]*HTTP\/1\.1 200 /, 'the 502, then the next answer on the same connection')
  t.equal(got[0]?.url, '/after')
})
