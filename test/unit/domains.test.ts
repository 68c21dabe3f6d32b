import t from 'tap'
import { coversSubdomains, matchesAny, matchesEntry, normalizeHost } from '../../src/policy/domains.js'

t.test('normalizeHost', async (t) => {
  t.equal(normalizeHost('API.Example.COM.'), 'api.example.com')
  t.equal(normalizeHost('localhost'), 'localhost')
  t.equal(normalizeHost('127.0.0.1'), '127.0.0.1')
  t.equal(normalizeHost('[::1]'), '::1')
  t.equal(normalizeHost('0:0:0:0:0:0:0:1'), '::1')
  t.equal(normalizeHost('bücher.example'), 'xn--bcher-kva.example')
  for (const bad of ['', 'https://x.com', 'x.com/path', 'x.com:443', '*.example.com', 'a b.com', 'user@x.com', '-bad-.com', `${'x'.repeat(64)}.com`]) {
    t.equal(normalizeHost(bad), null, JSON.stringify(bad))
  }
})

t.test('what the URL parser would rewrite into another host is refused, not stored as that host', async (t) => {
  const rewritten = [
    'ads.example.com\\.evil', // `\` reads as `/`: would be ads.example.com
    'ads.example.com\\', // would be ads.example.com
    '%41.com', // would be a.com
    'ex%2Eample.com',
    '123', // would be 0.0.0.123
    '1.2.3', // would be 1.2.0.3
    '127.1', // would be 127.0.0.1
    '0x7f.0.0.1', // hex octet
    '010.0.0.1', // octal octet: would be 8.0.0.1
    '1.2.3.04',
    '4294967295', // would be 255.255.255.255
    '256.1.1.1',
    '1.2.3.4.5',
    'example.123',
  ]
  for (const bad of rewritten) t.equal(normalizeHost(bad), null, JSON.stringify(bad))
  const kept: [string, string][] = [
    ['1.2.3.4', '1.2.3.4'],
    ['1.2.3.4.', '1.2.3.4'],
    ['0.0.0.0', '0.0.0.0'],
    ['255.255.255.255', '255.255.255.255'],
    ['a1.b2.example', 'a1.b2.example'],
  ]
  for (const [ok, want] of kept) t.equal(normalizeHost(ok), want, `${ok} is kept`)
})

t.test('which entries cover subdomains', async (t) => {
  t.ok(coversSubdomains('example.com'))
  t.ok(coversSubdomains('example.co.uk'), 'registrable under a two-label suffix')
  t.notOk(coversSubdomains('api.example.com'))
  t.notOk(coversSubdomains('api.example.co.uk'))
  t.notOk(coversSubdomains('localhost'))
  t.notOk(coversSubdomains('10.0.0.1'))
  t.ok(coversSubdomains('myapp.github.io'), 'private-section suffix: the registrable name covers its subdomains')
})

t.test('domain matching table', async (t) => {
  const table: [string, string, boolean][] = [
    ['example.com', 'example.com', true],
    ['example.com', 'api.example.com', true],
    ['example.com', 'a.b.example.com', true],
    ['example.com', 'badexample.com', false],
    ['example.com', 'example.com.evil.net', false],
    ['api.example.com', 'api.example.com', true],
    ['api.example.com', 'v2.api.example.com', false],
    ['api.example.com', 'example.com', false],
    ['example.co.uk', 'shop.example.co.uk', true],
    ['example.co.uk', 'other.co.uk', false],
    ['shop.example.co.uk', 'x.shop.example.co.uk', false],
    ['co.uk', 'anything.co.uk', true],
    ['localhost', 'localhost', true],
    ['localhost', 'foo.localhost', false],
    ['127.0.0.1', '127.0.0.1', true],
    ['127.0.0.1', '127.0.0.2', false],
    ['::1', '::1', true],
  ]
  for (const [entry, host, want] of table) t.equal(matchesEntry(entry, host), want, `${entry} vs ${host}`)
  t.ok(matchesAny(['x.org', 'example.com'], 'pay.example.com'))
  t.notOk(matchesAny([], 'example.com'))
})
