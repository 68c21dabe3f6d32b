import t from 'tap'
import { coversSubdomains, matchesAny, matchesEntry, normalizeHost } from '../../src/policy/domains.js'

t.test('normalizeHost', async (t) => {
  t.equal(normalizeHost('API.Example.COM.'), 'api.example.com')
  t.equal(normalizeHost('localhost'), 'localhost')
  t.equal(normalizeHost('127.0.0.1'), '127.0.0.1')
  t.equal(normalizeHost('[::1]'), '::1')
  t.equal(normalizeHost('0:0:0:0:0:0:0:1'), '::1')
  t.equal(normalizeHost('bücher.example'), 'xn--bcher-kva.example')
  for (const bad of ['', 'https://x.com', 'x.com/path', 'x.com:443', '*.example.com', 'a b.com', 'user@x.com', '-bad-.com', 'x'.repeat(64) + '.com']) {
    t.equal(normalizeHost(bad), null, JSON.stringify(bad))
  }
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
