import t from 'tap'
import { Writable } from 'node:stream'
import { loadConfig } from '../../src/config/load.js'
import { createLogger } from '../../src/log/index.js'
import { CHECK_ORDER, decide, formatIp, parseIp, parseRule, parseRules, type LocalView, type Target } from '../../src/net/egress-decide.js'
import { EgressGuard, type Resolver } from '../../src/net/egress.js'

/** The egress decision with plain data, and the guard around it with an injected resolver (no traffic at all). */

const OWN = 8545
const local: LocalView = { ownPorts: new Set([OWN, 8402, 8403]), ownAddresses: [parseIp('192.0.2.2')!, parseIp('fd00::2')!] }
const rules = (allow: string[] = [], deny: string[] = []) => ({ allow: parseRules(allow), deny: parseRules(deny) })
const at = (host: string, port: number, extra: Partial<Target> = {}): Target => {
  const ip = parseIp(host)
  return { name: ip ? null : host, port, addresses: ip ? [ip] : [], ...extra }
}
const verdict = (target: Target, allow: string[] = [], deny: string[] = []) => decide(target, rules(allow, deny), local)

t.test('every spelling of an address is one address', async (t) => {
  const loop = ['127.0.0.1', '127.1', '2130706433', '0x7f000001', '0177.0.0.1', '0x7f.1', '[::ffff:127.0.0.1]', '::ffff:7f00:1', '0:0:0:0:0:ffff:7f00:1', '64:ff9b::127.0.0.1', '127.0.0.1.']
  for (const s of loop) t.equal(formatIp(parseIp(s)!), '127.0.0.1', s)
  t.equal(formatIp(parseIp('0.0.0.0')!), '0.0.0.0')
  t.equal(formatIp(parseIp('[::]')!), '::')
  t.equal(formatIp(parseIp('0:0:0:0:0:0:0:1')!), '::1')
  t.equal(formatIp(parseIp('FE80::1%eth0')!), 'fe80::1')
  t.equal(formatIp(parseIp('2001:db8:0:0:1:0:0:1')!), '2001:db8::1:0:0:1')
  for (const bad of ['', 'example.com', '1.2.3.4.5', '256.0.0.1', '0x100000000', '4294967296', '1::2::3', '1:2:3:4:5:6:7:8:9', '::ffff:1.2.3', '12345::', 'g::1'])
    t.equal(parseIp(bad), null, `not an address: ${bad}`)
})

t.test("Paygate's own listeners are refused on every local address, whatever the configuration", async (t) => {
  const everything = ['0.0.0.0/0', '::/0', 'localhost', '*.localhost']
  for (const host of ['127.0.0.1', '127.1', '127.9.9.9', '2130706433', '0x7f000001', '0.0.0.0', '0', '::1', '::', '[::ffff:127.0.0.1]', '::ffff:7f00:1', '192.0.2.2', 'fd00::2']) {
    const v = verdict(at(host, OWN), everything)
    t.match(v, { allowed: false, reason: 'own_listener', always: true }, `${host}:${OWN}`)
    t.match(verdict(at(host, OWN, { operator: true })), { allowed: false, reason: 'own_listener' }, `${host}:${OWN} for an operator target too`)
  }
  t.match(verdict(at('localhost', OWN, { addresses: [parseIp('127.0.0.1')!] })), { allowed: false, reason: 'own_listener' })
  t.match(verdict(at('localhost', OWN)), { allowed: false, reason: 'own_listener' }, 'localhost is decided by name')
  t.match(verdict(at('app.localhost', 8402)), { allowed: false, reason: 'own_listener' })
  t.match(verdict(at('evil.example', OWN, { addresses: [parseIp('::ffff:127.0.0.1')!] })), { allowed: false, reason: 'own_listener' }, 'a name resolving to mapped loopback')
  // Loopback to other ports stays open (local merchants); so does another host on port 8545.
  for (const host of ['127.0.0.1', '127.1', '::1', '0.0.0.0', '[::ffff:127.0.0.1]']) t.match(verdict(at(host, 3000)), { allowed: true, by: 'default' }, `${host}:3000`)
  t.match(verdict(at('203.0.113.7', OWN)), { allowed: true }, 'a remote host on the same port number')
  t.match(verdict(at('192.0.2.2', 3000)), { allowed: true }, 'this host on another port')
})

t.test('link-local and metadata are always refused; allow lists cannot open them', async (t) => {
  const everything = ['0.0.0.0/0', '::/0', 'metadata.google.internal', 'metadata', 'instance-data']
  const cases: [Target, string][] = [
    [at('169.254.169.254', 80), 'link_local'],
    [at('169.254.0.1', 443), 'link_local'],
    [at('fe80::1', 80), 'link_local'],
    [at('febf::1', 80), 'link_local'],
    [at('[::ffff:169.254.169.254]', 80), 'link_local'],
    [at('fd00:ec2::254', 80), 'metadata'],
    [at('100.100.100.200', 80), 'metadata'],
    [at('metadata.google.internal', 80), 'metadata'],
    [at('metadata', 80), 'metadata'],
    [at('instance-data', 80), 'metadata'],
    [at('instance-data.ec2.internal', 80), 'metadata'],
    [at('imds.example', 80, { addresses: [parseIp('169.254.169.254')!] }), 'link_local'],
  ]
  for (const [target, reason] of cases) {
    t.match(verdict(target, everything), { allowed: false, reason, always: true }, `${target.name ?? formatIp(target.addresses[0]!)}: ${reason}`)
    t.match(verdict({ ...target, operator: true }), { allowed: false, reason }, 'for an operator target too')
  }
  t.match(verdict(at('fec0::1', 80)), { allowed: true }, 'fe80::/10 ends at febf')
})

t.test('private ranges are refused by default, opened by egress.allow (CIDR, address, name, port)', async (t) => {
  for (const [host, range] of [
    ['10.1.2.3', '10.0.0.0/8'],
    ['172.16.0.1', '172.16.0.0/12'],
    ['172.31.255.255', '172.16.0.0/12'],
    ['192.168.1.1', '192.168.0.0/16'],
    ['100.64.0.1', '100.64.0.0/10'],
    ['100.127.255.255', '100.64.0.0/10'],
    ['fd12::1', 'fc00::/7'],
    ['fc00::1', 'fc00::/7'],
    ['[::ffff:10.0.0.1]', '10.0.0.0/8'],
    ['64:ff9b::10.0.0.1', '10.0.0.0/8'],
  ] as const) {
    t.match(verdict(at(host, 80)), { allowed: false, reason: 'private', always: false, match: range }, host)
  }
  for (const host of ['172.32.0.1', '100.128.0.1', '11.0.0.1', '192.169.0.1', 'fe00::1']) t.match(verdict(at(host, 80)), { allowed: true }, `${host} is not private`)
  t.match(verdict(at('10.1.2.3', 80), ['10.0.0.0/8']), { allowed: true, by: 'allow_list' })
  t.match(verdict(at('10.1.2.3', 80), ['10.1.2.3']), { allowed: true, by: 'allow_list' })
  t.match(verdict(at('10.1.2.4', 80), ['10.1.2.3']), { allowed: false, reason: 'private' })
  t.match(verdict(at('10.1.2.3', 80), ['10.0.0.0/8:443']), { allowed: false }, 'another port')
  t.match(verdict(at('10.1.2.3', 443), ['10.0.0.0/8:443']), { allowed: true })
  t.match(verdict(at('10.1.2.3', 8081), ['10.0.0.0/8:8080-8089']), { allowed: true }, 'a port range')
  t.match(verdict(at('fd12::1', 443), ['[fc00::/7]:443']), { allowed: true })
  const intranet = at('db.corp', 5432, { addresses: [parseIp('10.0.0.5')!] })
  t.match(verdict(intranet), { allowed: false, reason: 'private' })
  t.match(verdict(intranet, ['db.corp']), { allowed: true, by: 'allow_list' }, 'a name in egress.allow')
  t.match(verdict(intranet, ['*.corp']), { allowed: true }, '*.corp covers subdomains')
  t.match(verdict({ ...intranet, name: 'corp' }, ['*.corp']), { allowed: false }, 'but not the domain itself')
  t.match(verdict(intranet, ['db.corp:80']), { allowed: false }, 'a name on another port')
  t.match(verdict({ ...intranet, operator: true }), { allowed: true, by: 'operator' }, 'an operator target skips the defaults')
  // A name with one forbidden address is refused as a whole.
  t.match(verdict(at('mixed.example', 80, { addresses: [parseIp('203.0.113.1')!, parseIp('10.0.0.1')!] })), { allowed: false, reason: 'private', address: '10.0.0.1' })
  t.match(verdict(at('224.0.0.1', 80)), { allowed: false, reason: 'reserved' })
  t.match(verdict(at('255.255.255.255', 80)), { allowed: false, reason: 'reserved' })
  t.match(verdict(at('ff02::1', 80)), { allowed: false, reason: 'reserved' })
  t.match(verdict(at('203.0.113.9', 443)), { allowed: true, by: 'default' })
})

t.test('egress.deny closes anything outside the always list, over egress.allow, for operator targets too', async (t) => {
  t.match(verdict(at('127.0.0.1', 5432), [], ['127.0.0.1:5432']), { allowed: false, reason: 'deny_list', match: '127.0.0.1:5432' })
  t.match(verdict(at('127.1', 5432), [], ['127.0.0.0/8:5432']), { allowed: false, reason: 'deny_list' })
  t.match(verdict(at('::ffff:127.0.0.1', 5432), [], ['127.0.0.1:5432']), { allowed: false, reason: 'deny_list' })
  t.match(verdict(at('localhost', 5432, { addresses: [parseIp('127.0.0.1')!] }), [], ['127.0.0.1:5432']), { allowed: false }, 'by what the name resolves to')
  t.match(verdict(at('127.0.0.1', 5433), [], ['127.0.0.1:5432']), { allowed: true }, 'another port')
  t.match(verdict(at('::1', 6379), [], ['[::1]:6379']), { allowed: false, reason: 'deny_list' })
  t.match(verdict(at('10.0.0.1', 80), ['10.0.0.0/8'], ['10.0.0.1']), { allowed: false, reason: 'deny_list' }, 'deny wins over allow')
  t.match(verdict(at('api.example', 443, { addresses: [parseIp('203.0.113.1')!] }), [], ['api.example']), { allowed: false, reason: 'deny_list' })
  t.match(verdict(at('x.api.example', 443, { addresses: [parseIp('203.0.113.1')!] }), [], ['*.api.example']), { allowed: false })
  t.match(verdict(at('203.0.113.1', 443, { operator: true }), [], ['203.0.113.0/24']), { allowed: false, reason: 'deny_list' })
})

t.test('the checks run in CHECK_ORDER: a target failing several gets the first', async (t) => {
  t.same(CHECK_ORDER, ['metadata', 'link_local', 'own_listener', 'deny_list', 'private', 'reserved'])
  // metadata before link_local: a metadata name resolving to 169.254.169.254.
  t.match(verdict(at('metadata', OWN, { addresses: [parseIp('169.254.169.254')!] }), [], ['metadata']), { reason: 'metadata' })
  t.match(verdict(at('two.example', 80, { addresses: [parseIp('169.254.1.1')!, parseIp('fd00:ec2::254')!] })), { reason: 'metadata' }, 'over all addresses')
  // link_local before own_listener (on an own port) and deny_list, by name too.
  t.match(verdict(at('imds.example', 80, { addresses: [parseIp('169.254.169.254')!] }), [], ['imds.example']), { reason: 'link_local' })
  t.match(verdict(at('169.254.1.1', OWN), [], ['169.254.0.0/16']), { reason: 'link_local' })
  // own_listener before deny_list.
  t.match(verdict(at('127.0.0.1', OWN), [], ['127.0.0.1']), { reason: 'own_listener' })
  // deny_list before private.
  t.match(verdict(at('10.0.0.1', 80), [], ['10.0.0.1']), { reason: 'deny_list' })
  // private before reserved: a name resolving into both.
  t.match(verdict(at('both.example', 80, { addresses: [parseIp('224.0.0.1')!, parseIp('10.0.0.1')!] })), { reason: 'private' })
})

t.test('egress entries: what is accepted and what is refused with a reason', async (t) => {
  for (const ok of [
    '10.0.0.0/8',
    '10.1.2.3',
    'fc00::/7',
    '::1',
    '[::1]',
    '[::1]:6379',
    '[fc00::/7]:443',
    '127.0.0.1:5432',
    '10.0.0.0/8:8000-8999',
    'api.internal',
    'API.Internal.',
    '*.internal',
    'db.corp:5432',
    '::ffff:10.0.0.0/104',
    '0.0.0.0/0',
    '::/0',
  ]) {
    t.type(parseRule(ok), 'object', ok)
  }
  t.match(parseRule('10.1.2.3/8'), /bits are set past the prefix length \(the network is 10\.0\.0\.0\/8\)/)
  t.match(parseRule('127.1'), /dotted quad/)
  t.match(parseRule('10.0/8'), /dotted quad/)
  t.match(parseRule('10.0.0.0/33'), /at most 32/)
  t.match(parseRule('fc00::/129'), /at most 128/)
  t.match(parseRule('1.2.3.4:0'), /port/)
  t.match(parseRule('1.2.3.4:70000'), /port/)
  t.match(parseRule('1.2.3.4:90-80'), /port/)
  t.match(parseRule('[api.internal]:80'), /IPv6/)
  t.match(parseRule('::ffff:10.0.0.0/90'), /at least \/96/)
  for (const bad of ['', 'http://x', 'a b', 'x/y', '1::2::3', '-bad.example', '*.']) t.type(parseRule(bad), 'string', `refused: ${JSON.stringify(bad)}`)
})

t.test('egress.allow and egress.deny load from the environment and the file, and a bad entry stops the start', async (t) => {
  const { config } = loadConfig({ env: { PAYGATE_EGRESS_ALLOW: '10.20.0.0/16, billing.internal:8080', PAYGATE_EGRESS_DENY: '[::1]:6379' } })
  t.same(config.egress, { allow: ['10.20.0.0/16', 'billing.internal:8080'], deny: ['[::1]:6379'] })
  t.same(loadConfig({}).config.egress, { allow: [], deny: [] }, 'empty by default')
  t.throws(() => loadConfig({ env: { PAYGATE_EGRESS_ALLOW: '10.0.0.1/8,ok.example' } }), {
    code: 'invalid_config',
    message: /egress\.allow = .*10\.0\.0\.1\/8.*PAYGATE_EGRESS_ALLOW.*the network is 10\.0\.0\.0\/8/,
  })
  t.throws(() => loadConfig({ argv: ['--egress-deny', 'not a host'] }), { code: 'invalid_config', message: /egress\.deny/ })
})

/** A guard whose log lines are kept. */
function guard(opts: { allow?: string[]; deny?: string[]; resolver?: Resolver } = {}) {
  const lines: any[] = []
  const sink = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n').filter(Boolean)) lines.push(JSON.parse(l))
      cb()
    },
  })
  const asked: string[] = []
  const resolver: Resolver =
    opts.resolver ??
    (async (h) => {
      asked.push(h)
      if (h === 'intranet.test') return [{ address: '10.1.2.3', family: 4 }]
      if (h === 'merchant.test')
        return [
          { address: '127.0.0.1', family: 4 },
          { address: '::1', family: 6 },
        ]
      throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${h}`), { code: 'ENOTFOUND' })
    })
  const g = new EgressGuard({ allow: opts.allow ?? [], deny: opts.deny ?? [], log: createLogger('info', sink), resolver, interfaces: () => ['127.0.0.1', '192.0.2.2'] })
  g.protect(OWN)
  return { g, lines, asked }
}

t.test('the guard: literals decided without the resolver, names resolved once, every refusal counted and logged', async (t) => {
  const { g, lines, asked } = guard()
  for (const host of ['127.1', '2130706433', '0x7f000001', '0.0.0.0', '[::ffff:127.0.0.1]', '192.0.2.2']) {
    t.throws(() => g.checkNow(host, OWN), { code: 'egress_denied', extra: { reason: 'own_listener' } }, host)
  }
  t.same(g.checkNow('127.1', 3000), { address: '127.0.0.1', family: 4 }, 'a literal comes back canonical')
  t.equal(g.checkNow('merchant.test', 3000), null, 'a name needs resolving')
  t.throws(() => g.checkNow('metadata.google.internal', 80), { code: 'egress_denied', extra: { reason: 'metadata' } }, 'a metadata name, by name')
  t.same(asked, [], 'none of that asked the resolver')
  t.same(await g.check('merchant.test', 3000), [
    { address: '127.0.0.1', family: 4 },
    { address: '::1', family: 6 },
  ])
  t.same(asked, ['merchant.test'])
  await t.rejects(g.check('merchant.test', OWN), { code: 'egress_denied', extra: { reason: 'own_listener' } })
  const denied = await g.check('intranet.test', 8080).catch((e: Error) => e)
  t.match(denied, { code: 'egress_denied', status: 403, detail: /^connections to intranet\.test:8080 are not allowed: it resolves to an address in 10\.0\.0\.0\/8, a private range/ })
  t.notMatch((denied as Error).message, /10\.1\.2\.3/, 'the agent is not told the address')
  await t.rejects(g.check('nowhere.test', 80), { code: 'ENOTFOUND' }, "the resolver's own error")
  t.equal(g.counters.denied, 9)
  t.same(g.counters.byReason, { metadata: 1, link_local: 0, own_listener: 7, deny_list: 0, private: 1, reserved: 0 })
  t.equal(lines.length, 9, 'one warning per refusal')
  t.match(lines.at(-1), { level: 'warn', msg: 'egress denied', host: 'intranet.test', port: 8080, reason: 'private', match: '10.0.0.0/8', address: '10.1.2.3' })
  // Operator targets: the defaults do not apply, the always list does.
  t.same(await g.check('intranet.test', 8080, { operator: true }), [{ address: '10.1.2.3', family: 4 }])
  t.throws(() => g.checkNow('169.254.169.254', 80, { operator: true }), { code: 'egress_denied' })
  t.match(lines.at(-1), { operator: true, reason: 'link_local' })
})

t.test("the guard's lookup for sockets hands net only the checked addresses, resolving once", async (t) => {
  let calls = 0
  const answers = [[{ address: '127.0.0.1', family: 4 as const }], [{ address: '10.0.0.1', family: 4 as const }]]
  const { g } = guard({
    resolver: async () => {
      calls++
      return answers[Math.min(calls - 1, 1)]!
    },
  })
  const to = g.connectOptions('rebind.test', 3000)
  t.equal(to.host, 'rebind.test', 'a name stays the name (TLS servername)')
  t.equal(calls, 0, 'nothing resolved until net asks')
  const all = await new Promise<unknown>((resolve) => to.lookup('rebind.test', { all: true }, ((e: Error | null, a: unknown) => resolve(e ?? a)) as never))
  t.same(all, [{ address: '127.0.0.1', family: 4 }])
  t.equal(calls, 1)
  const next = g.connectOptions('rebind.test', 3000)
  const refused = await new Promise<unknown>((resolve) => next.lookup('rebind.test', {}, ((e: Error | null, a: unknown) => resolve(e ?? a)) as never))
  t.match(refused, { code: 'egress_denied' }, 'a new connection checks the new answer')
  t.same(g.connectOptions('0x7f000001', 3000).host, '127.0.0.1', 'a literal is connected to as its canonical address')
  t.throws(() => g.connectOptions('127.1', OWN), { code: 'egress_denied' }, 'and refused at once')
})
