import t from 'tap'
import { BodyFramer, headEnd, parseRequestHead, parseResponseHead, relayResponseHead, responseFraming, simpleHttpTarget, type Framing } from '../../src/upstream/http1.js'

const req = (text: string) => {
  const b = Buffer.from(text, 'latin1')
  const end = headEnd(b)
  return end < 0 ? 'incomplete' : parseRequestHead(b, end)
}
const res = (text: string) => {
  const b = Buffer.from(text, 'latin1')
  return parseResponseHead(b, headEnd(b))!
}

t.test('request heads: the fast path takes a strict subset, the rest is left to Node', async (t) => {
  const ok = req('GET http://a.example/x?y=1 HTTP/1.1\r\nHost: a.example\r\nX-Two: 1\r\nx-two: 2\r\nAccept:  text/plain \r\n\r\n')
  t.match(ok, { method: 'GET', target: 'http://a.example/x?y=1', raw: ['Host', 'a.example', 'X-Two', '1', 'x-two', '2', 'Accept', 'text/plain'] })
  t.same((ok as { map: unknown }).map, { host: 'a.example', 'x-two': '1, 2', accept: 'text/plain' })
  t.equal(req('GET / HTTP/1.1\r\nHost: a'), 'incomplete')
  const refused: Record<string, string> = {
    'HTTP/1.0': 'GET / HTTP/1.0\r\n\r\n',
    'obs-fold': 'GET / HTTP/1.1\r\nX-A: 1\r\n  continued\r\n\r\n',
    'bare LF in a field': 'GET / HTTP/1.1\r\nX-A: 1\nX-B: 2\r\n\r\n',
    'space before colon': 'GET / HTTP/1.1\r\nX-A : 1\r\n\r\n',
    'no colon': 'GET / HTTP/1.1\r\nX-A\r\n\r\n',
    'control character in a value': 'GET / HTTP/1.1\r\nX-A: a\x01b\r\n\r\n',
    'form feed around a value (not OWS)': 'GET / HTTP/1.1\r\nContent-Length: 0\x0c\r\n\r\n',
    'lower-case version': 'GET / http/1.1\r\n\r\n',
    'two spaces': 'GET  / HTTP/1.1\r\n\r\n',
    'no target': 'GET HTTP/1.1\r\n\r\n',
    'bad method': 'G(T / HTTP/1.1\r\n\r\n',
    'bare CR in a value': 'GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n',
    'NUL in a value': 'GET / HTTP/1.1\r\nX-A: a\x00\r\n\r\n',
    'DEL in a value': 'GET / HTTP/1.1\r\nX-A: a\x7f\r\n\r\n',
    'empty name': 'GET / HTTP/1.1\r\n: a\r\n\r\n',
    'tab before colon': 'GET / HTTP/1.1\r\nX-A\t: a\r\n\r\n',
    'non-ASCII name': 'GET / HTTP/1.1\r\nX-\xe9: a\r\n\r\n',
  }
  for (const [why, text] of Object.entries(refused)) t.equal(req(text), null, why)
})

/** The field rules as a plain split-and-regex reading (RFC 9112 §5), to check the one-pass scanner against. */
function referenceFields(text: string): { raw: string[]; map: Record<string, string | string[]> } | null {
  const lines = text.split('\r\n')
  if (lines.some((l) => l.includes('\r') || l.includes('\n'))) return null
  const raw: string[] = []
  const map: Record<string, string | string[]> = {}
  for (const line of lines.slice(1)) {
    const c = line.indexOf(':')
    if (c <= 0) return null
    const name = line.slice(0, c)
    const value = line.slice(c + 1).replace(/^[\t ]+|[\t ]+$/g, '')
    if (!/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(name) || !/^[\t\x20-\x7e\x80-\xff]*$/.test(value)) return null
    raw.push(name, value)
    const k = name.toLowerCase()
    const prev = map[k]
    if (prev === undefined) map[k] = k === 'set-cookie' ? [value] : value
    else if (Array.isArray(prev)) prev.push(value)
    else map[k] = `${prev}, ${value}`
  }
  return { raw, map }
}

t.test('field lines: the one-pass scanner reads 5,000 generated heads as the split-and-regex rules do', async (t) => {
  // A fixed seed, so a failure can be replayed.
  let seed = 42
  const rnd = (n: number): number => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff
    return seed % n
  }
  const pick = (s: string): string => s[rnd(s.length)]!
  const NAME = 'abcXYZ-_09!~.'
  const VALUE = 'ab Z9:;/"\t\x80\xff'
  const ODD = '\r\n\x00\x01\x7f\x0c :\t('
  let agreed = 0
  let accepted = 0
  for (let i = 0; i < 5000; i++) {
    let text = 'GET http://a.example/ HTTP/1.1'
    const fields = rnd(6)
    for (let f = 0; f < fields; f++) {
      let name = ''
      for (let j = 1 + rnd(6); j > 0; j--) name += rnd(40) === 0 ? pick(ODD) : pick(NAME)
      let value = ''
      for (let j = rnd(8); j > 0; j--) value += rnd(30) === 0 ? pick(ODD) : pick(VALUE)
      if (rnd(5) === 0) name = ['Set-Cookie', 'set-cookie', 'X-Dup', 'x-dup'][rnd(4)]!
      text += `\r\n${name}:${rnd(3) === 0 ? ' \t' : ''}${value}${rnd(4) === 0 ? ' ' : ''}`
    }
    const b = Buffer.from(`${text}\r\n\r\n`, 'latin1')
    const end = headEnd(b)
    const want = end === b.length ? referenceFields(text) : null
    const got = end === b.length ? parseRequestHead(b, end) : null
    const same =
      want === null ? got === null : got !== null && JSON.stringify([got.raw, got.map]) === JSON.stringify([want.raw, want.map]) && got.names.every((n, k) => n === got.raw[2 * k]!.toLowerCase())
    if (!same) {
      t.fail(`differs on ${JSON.stringify(text)}: ${JSON.stringify(got)} vs ${JSON.stringify(want)}`)
      break
    }
    agreed++
    if (got) accepted++
  }
  t.equal(agreed, 5000, 'all agree')
  t.ok(accepted > 500 && accepted < 4500, `both readings seen (${accepted} accepted)`)
})

t.test('response heads and framing (RFC 9112 §6.3)', async (t) => {
  const h = res('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n')
  t.match(h, { minor: 1, status: 200, reason: 'OK' })
  t.match(res('HTTP/1.1 404\r\n\r\n'), { status: 404, reason: '' })
  t.equal(parseResponseHead(Buffer.from('HTTP/2 200 OK\r\n\r\n'), 17), null)
  const table: Array<[string, string, Framing | null]> = [
    ['HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n', 'GET', { kind: 'length', length: 12 }],
    ['HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n', 'GET', { kind: 'chunked' }],
    ['HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n', 'GET', { kind: 'chunked' }],
    ['HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n', 'HEAD', { kind: 'none' }],
    ['HTTP/1.1 204 No Content\r\n\r\n', 'GET', { kind: 'none' }],
    ['HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n', 'GET', { kind: 'none' }],
    ['HTTP/1.1 200 OK\r\n\r\n', 'GET', { kind: 'close' }],
    // left to the general path
    ['HTTP/1.1 100 Continue\r\n\r\n', 'GET', null],
    ['HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n', 'GET', null],
    ['HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n', 'GET', null],
    ['HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n', 'GET', null],
    ['HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n', 'GET', null],
  ]
  for (const [text, method, want] of table) t.same(responseFraming(res(text), method), want, `${method} ${JSON.stringify(text)}`)
})

/** Feed `body` (plus trailing bytes) split at every position, as it may arrive. */
function framedAt(framing: Framing, body: Buffer, decode: boolean): Array<{ end: number; decoded: string }> {
  const out = []
  const extra = Buffer.from('NEXT')
  const all = Buffer.concat([body, extra])
  for (let cut = 0; cut <= all.length; cut++) {
    const f = new BodyFramer(framing, decode)
    let end = -1
    let offset = 0
    for (const part of [all.subarray(0, cut), all.subarray(cut)]) {
      if (end >= 0) break
      const e = f.feed(part)
      if (e >= 0) end = offset + e
      offset += part.length
    }
    out.push({ end, decoded: Buffer.concat(f.decoded).toString() })
  }
  return out
}

t.test('body framing finds the end wherever the bytes are split', async (t) => {
  const chunked = Buffer.from('5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nTrailer: x\r\n\r\n')
  for (const r of framedAt({ kind: 'chunked' }, chunked, false)) t.equal(r.end, chunked.length)
  const decoded = framedAt({ kind: 'chunked' }, chunked, true)
  t.ok(
    decoded.every((r) => r.end === chunked.length && r.decoded === 'hello, world'),
    'decoded data is the chunks without framing, for every split',
  )
  const fixed = Buffer.from('0123456789')
  t.ok(framedAt({ kind: 'length', length: 10 }, fixed, false).every((r) => r.end === 10))
  const untilClose = new BodyFramer({ kind: 'close' })
  t.equal(untilClose.feed(Buffer.from('any bytes\r\n\r\n')), -1, 'a close-delimited body never ends by its bytes')
  t.ok(untilClose.closeDelimited)
  const none = new BodyFramer({ kind: 'none' })
  t.equal(none.feed(Buffer.from('next request')), 0)
  t.equal(new BodyFramer({ kind: 'length', length: 0 }).feed(Buffer.alloc(0)), 0)
  for (const bad of ['zz\r\n', '5\r\nhelloXY\r\n', '5\nhello\r\n', `${'f'.repeat(13)}\r\n`]) {
    t.throws(() => new BodyFramer({ kind: 'chunked' }).feed(Buffer.from(bad)), JSON.stringify(bad))
  }
})

t.test('relayed heads drop hop-by-hop fields and keep the body framing', async (t) => {
  const h = res(
    'HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nProxy-Authenticate: Basic\r\n\r\n',
  )
  t.equal(relayResponseHead(h, false), 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n')
  t.equal(relayResponseHead(res('HTTP/1.1 204 No Content\r\n\r\n'), true), 'HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n')
})

t.test('simple absolute-form targets read exactly as new URL reads them', async (t) => {
  const cases = [
    'http://a.example/x?y=1',
    'http://A.Example:8080/Path/To?Q=%20',
    'http://127.0.0.1:18080/',
    'http://example.com:80/x',
    'http://example.com',
    'http://example.com./a;b=c/@d:e',
    'http://example.com/a/./b',
    'http://example.com/a/%2E%2E/b',
    'http://example.com/..',
    'http://127.1/',
    'http://0x7f.0.0.1/',
    'http://foo.123/',
    'http://010.0.0.1/',
    'http://[::1]:80/',
    'http://user:pw@example.com/',
    'http://example.com:65536/',
    'http://example.com:0080/',
    "http://example.com/it's",
    'http://example.com/a b',
    'http://exa_mple.com/',
    'http://-bad.com/',
    'https://example.com/',
  ]
  const chars = "aZ09.-/:?%2eE@'_~!$&()*+,;=x"
  let seed = 7
  const rnd = (n: number): number => (seed = (seed * 1103515245 + 12345) % 2 ** 31) % n
  for (let i = 0; i < 3000; i++) {
    let s = ''
    for (let j = rnd(12); j > 0; j--) s += chars[rnd(chars.length)]
    cases.push(`http://${['h.example', '10.0.0.1', 'H.example:81', '1.2.3.4:80'][rnd(4)]}/${s}`)
  }
  let fast = 0
  const differ: string[] = []
  for (const c of cases) {
    const got = simpleHttpTarget(c)
    if (!got) continue
    fast++
    const u = new URL(c)
    const want = { href: u.href, authority: u.host, hostname: u.hostname, port: u.port ? Number(u.port) : 80, path: u.pathname + u.search }
    if (JSON.stringify(got) !== JSON.stringify(want)) differ.push(c)
  }
  t.same(differ, [], 'no target reads differently from new URL')
  t.same(simpleHttpTarget('http://A.Example:8080/p?q=1'), { href: 'http://a.example:8080/p?q=1', authority: 'a.example:8080', hostname: 'a.example', port: 8080, path: '/p?q=1' })
  t.ok(fast > 1000, `most generated targets take the fast reading (${fast})`)
  for (const slow of ['http://127.1/', 'http://[::1]:80/', 'http://user:pw@example.com/', 'http://example.com/a/./b', 'http://example.com/a/%2E%2E/b', 'http://foo.123/']) {
    t.equal(simpleHttpTarget(slow), null, slow)
  }
})
