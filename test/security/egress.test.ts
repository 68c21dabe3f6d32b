import t, { type Test } from 'tap'
import { subscribe } from 'node:diagnostics_channel'
import { lookup } from 'node:dns'
import { createServer, request as httpRequest, type IncomingHttpHeaders, type Server } from 'node:http'
import { connect, type Socket } from 'node:net'
import { encodeFunctionData, type Hex } from 'viem'
import { privateKeyToAccount, generatePrivateKey } from 'viem/accounts'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import type { ResolvedAddress, Resolver } from '../../src/net/egress.js'
import { startTestGateway, testChain, type TestGateway } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * The egress guard on a real gateway: an agent cannot reach Paygate's own listeners (the
 * embedded chain's JSON-RPC above all: its dev methods move anyone's funds), cloud metadata
 * or private ranges through `POST /v1/pay`, the proxy, CONNECT tunnels or WebSocket upgrades,
 * in any spelling of the address; names resolve once and the connection goes to what was
 * checked. Only loopback traffic: other addresses come from an injected resolver and are
 * refused before any connection (every connection attempt of this process is watched).
 */

// Every TCP connection attempt of this process (the gateway runs in it), by address.
const attempts: { address: string; port: number }[] = []
subscribe('net.client.socket', (m) => {
  const socket = (m as { socket: Socket }).socket
  socket.on('connectionAttempt', (address: string, port: number) => attempts.push({ address, port }))
})
/** This host: loopback in its spellings, the unspecified address (Linux connects it to loopback), or a Unix socket (the embedded chain's IPC). */
const loopback = (a: string): boolean => /^(127\.|0\.0\.0\.0$|::1$|::ffff:127\.|::ffff:7f[0-9a-f]{2}:|\/)/.test(a)

/** Only `localhost` reaches the system resolver (/etc/hosts): no DNS query leaves this machine. */
const system = (host: string): Promise<ResolvedAddress[]> =>
  host === 'localhost'
    ? new Promise((resolve, reject) => lookup(host, { all: true }, (e, a) => (e ? reject(e) : resolve(a.map((x) => ({ address: x.address, family: x.family === 6 ? 6 : 4 }))))))
    : Promise.reject(Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' }))

/** Test names: a fixed answer, or one answer per call (a rebinding DNS server). */
const names: Record<string, ResolvedAddress[] | ResolvedAddress[][]> = {
  'intranet.test': [{ address: '10.1.2.3', family: 4 }],
  'mixed.test': [
    { address: '127.0.0.1', family: 4 },
    { address: '10.1.2.3', family: 4 },
  ],
  'imds.test': [{ address: '169.254.169.254', family: 4 }],
  'mapped.test': [{ address: '::ffff:127.0.0.1', family: 6 }],
}
const asked: string[] = []
const resolver: Resolver = async (host) => {
  asked.push(host)
  const a = names[host]
  if (!a) return system(host)
  if (Array.isArray(a[0])) {
    const seq = a as ResolvedAddress[][]
    return seq.length > 1 ? seq.shift()! : seq[0]!
  }
  return a as ResolvedAddress[]
}

// A loopback server for the rebinding tests: the address a name is checked at (127.0.0.1),
// and another one on the same port (127.0.0.2) that egress.deny refuses. Each answer closes
// its connection, so every request opens (and checks) a new one.
const hits = { checked: 0, other: 0 }
const rebindServer = (which: keyof typeof hits): Server =>
  createServer((_req, res) => {
    hits[which]++
    res.writeHead(200, { 'content-type': 'application/json', connection: 'close' })
    res.end(JSON.stringify({ served: which }))
  })
const rebindPort = await listenForTest(t, rebindServer('checked'))
const other = rebindServer('other')
await new Promise<void>((r) => other.listen(rebindPort, '127.0.0.2', r))
t.teardown(() => new Promise<void>((r) => other.close(() => r())))

// A plain loopback target on another port: allowed by default, denied on the second gateway by egress.deny.
let plainHits = 0
const plainPort = await listenForTest(
  t,
  createServer((_req, res) => {
    plainHits++
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('{"ok":true}')
  }),
)

const PASS_THROUGH = ['2130706433', '0x7f000001', 'localhost', '::ffff:127.0.0.1']
const gw = await startTestGateway({
  env: { PAYGATE_EGRESS_DENY: '127.0.0.2', PAYGATE_PROXY_PASS_THROUGH: PASS_THROUGH.join(',') },
  options: { resolver },
})
t.teardown(() => gw.close())
const { info, balanceOf } = await testChain(gw)
const rpcPort = Number(new URL(info.rpcUrl).port)
const apiPort = Number(new URL(gw.gw.apiUrl).port)
const proxyPort = Number(new URL(gw.gw.proxyUrl).port)

async function agent(g: TestGateway, id: string): Promise<{ key: string; auth: string; address: Hex }> {
  const key = (await g.api('POST', '/v1/agents', { body: { agentId: id } })).body.apiKey as string
  const address = (await g.api('POST', '/v1/wallets', { body: { agentId: id } })).body.address as Hex
  return { key, auth: `Basic ${Buffer.from(`${id}:${key}`).toString('base64')}`, address }
}
const victim = await agent(gw, 'victim')
const attacker = await agent(gw, 'attacker')
const thief = privateKeyToAccount(generatePrivateKey()).address
const victimFunds = await balanceOf(victim.address)
t.ok(victimFunds > 0n, 'the victim holds USDC from the dev faucet')

/** The finding: impersonate the victim on the chain's RPC, then send its USDC away. */
const theft = [
  { jsonrpc: '2.0', id: 1, method: 'anvil_impersonateAccount', params: [victim.address] },
  {
    jsonrpc: '2.0',
    id: 2,
    method: 'eth_sendTransaction',
    params: [{ from: victim.address, to: info.token, gas: '0x30000', data: encodeFunctionData({ abi: paygateUsdcAbi, functionName: 'transfer', args: [thief, victimFunds] }) }],
  },
]

/** Every spelling of this host on the chain's RPC port. */
const SPELLINGS = ['127.0.0.1', '127.1', '2130706433', '0x7f000001', '0.0.0.0', 'localhost', '[::ffff:127.0.0.1]', '[::ffff:7f00:1]', '[::1]']

async function fundsUntouched(t: Test): Promise<void> {
  // anvil mines asynchronously: give a transfer that was sent the time to land.
  await new Promise((r) => setTimeout(r, 300))
  t.equal(await balanceOf(victim.address), victimFunds, "the victim's USDC is where it was")
  t.equal(await balanceOf(thief), 0n, 'nothing reached the thief')
}

type Answer = { status: number; headers: IncomingHttpHeaders; body: any; text: string }

/** An absolute-form request through the proxy (a body takes Node's parser, none the fast path). */
function viaProxy(g: TestGateway, auth: string, method: string, url: string, body?: unknown, extra: Record<string, string> = {}): Promise<Answer> {
  const p = new URL(g.gw.proxyUrl)
  const payload = body === undefined ? undefined : JSON.stringify(body)
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: p.hostname,
        port: p.port,
        method,
        path: url,
        agent: false,
        headers: { host: new URL(url).host, 'proxy-authorization': auth, ...(payload ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } : {}), ...extra },
      },
      (res) => {
        let text = ''
        res.on('data', (c: Buffer) => (text += c.toString()))
        res.on('end', () => {
          let parsed: unknown
          try {
            parsed = JSON.parse(text)
          } catch {
            parsed = undefined
          }
          resolve({ status: res.statusCode!, headers: res.headers, body: parsed, text })
        })
      },
    )
    req.on('error', reject)
    req.end(payload)
  })
}

/** Raw bytes to the proxy port, read until the proxy closes or goes quiet. */
function raw(port: number, send: (s: Socket, head: string) => string | null, quietMs = 1500): Promise<{ head: string; all: string }> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1')
    let all = ''
    let head: string | null = null
    let timer: NodeJS.Timeout | undefined
    const done = (): void => {
      clearTimeout(timer)
      s.destroy()
      resolve({ head: head ?? all, all })
    }
    const quiet = (): void => {
      clearTimeout(timer)
      timer = setTimeout(done, quietMs)
    }
    s.on('data', (d: Buffer) => {
      all += d.toString('latin1')
      if (head === null && all.includes('\r\n\r\n')) {
        head = all.slice(0, all.indexOf('\r\n\r\n'))
        const more = send(s, head)
        if (more !== null) s.write(more)
      }
      quiet()
    })
    s.on('close', done)
    s.on('error', done)
    s.on('connect', () => {
      const first = send(s, '')
      if (first !== null) s.write(first)
      quiet()
    })
  })
}

const statusOf = (head: string): number => Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0)
const jsonPost = (authority: string, body: unknown): string => {
  const text = JSON.stringify(body)
  return `POST / HTTP/1.1\r\nHost: ${authority}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`
}

/** CONNECT to `authority`; if the tunnel opens, send `inner` (plain HTTP) inside it. */
function tunnel(auth: string, authority: string, inner: string | null): Promise<{ head: string; all: string }> {
  return raw(proxyPort, (_s, head) => {
    if (head === '') return `CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\nProxy-Authorization: ${auth}\r\n\r\n`
    return statusOf(head) === 200 ? inner : null
  })
}

/** 403 egress_denied; from the proxy (plain headers, not the API client's `Headers`) with X-Paygate-Error too. */
function refusedAt(t: Test, r: { status: number; body: any; headers: IncomingHttpHeaders | Headers }, what: string): void {
  t.equal(r.status, 403, `${what}: 403`)
  t.equal(r.body?.error, 'egress_denied', `${what}: egress_denied`)
  if (!(r.headers instanceof Headers)) t.equal(r.headers['x-paygate-error'], 'egress_denied', `${what}: X-Paygate-Error`)
}

t.test("the chain RPC theft through POST /v1/pay is refused in every spelling, and the victim's USDC stays", async (t) => {
  const before = { denied: gw.gw.egress?.counters.denied, ownListener: gw.gw.egress?.counters.byReason.own_listener, lines: gw.logs.length }
  for (const host of SPELLINGS) {
    for (const call of theft) {
      const r = await gw.api('POST', '/v1/pay', { key: attacker.key, body: { agentId: 'attacker', endpoint: `http://${host}:${rpcPort}/`, method: 'POST', body: call } })
      refusedAt(t, r, `${call.method} at ${host}`)
      t.match(r.body.detail, /own listeners/, `${host}: the detail says why`)
    }
  }
  await fundsUntouched(t)
  t.equal(gw.gw.egress.counters.denied - before.denied!, SPELLINGS.length * theft.length, 'each denial counted')
  t.equal(gw.gw.egress.counters.byReason.own_listener - before.ownListener!, SPELLINGS.length * theft.length, 'as own_listener')
  const lines = gw.logs.slice(before.lines).filter((l) => l.includes('"egress denied"'))
  t.equal(lines.length, SPELLINGS.length * theft.length, 'each denial logged')
  t.match(JSON.parse(lines.at(-1)!), { level: 'warn', msg: 'egress denied', port: rpcPort, reason: 'own_listener' })
  t.notOk(
    gw.logs.some((l) => l.includes(attacker.key)),
    'no agent key in the log',
  )
})

t.test('the same theft through the proxy: absolute-form requests, CONNECT tunnels (intercepted and pass-through), a WebSocket upgrade', async (t) => {
  for (const host of SPELLINGS) {
    const url = `http://${host}:${rpcPort}/`
    for (const call of theft) refusedAt(t, await viaProxy(gw, attacker.auth, 'POST', url, call), `proxied ${call.method} at ${host}`)
    refusedAt(t, await viaProxy(gw, attacker.auth, 'GET', url), `proxied GET (fast path) at ${host}`)
  }
  // CONNECT: IP spellings as the agent writes them (brackets for IPv6), both kinds of tunnel.
  const connectHosts = ['127.0.0.1', '127.1', '2130706433', '0x7f000001', '0.0.0.0', 'localhost', '[::ffff:127.0.0.1]', '[::1]']
  for (const host of connectHosts) {
    const authority = `${host}:${rpcPort}`
    const kind = PASS_THROUGH.includes(host.replace(/^\[|\]$/g, '')) ? 'pass-through' : 'intercepted'
    for (const call of theft) {
      const r = await tunnel(attacker.auth, authority, jsonPost(authority, call))
      t.equal(statusOf(r.head), 403, `CONNECT ${authority} (${kind}): 403`)
      t.match(r.head, /x-paygate-error: egress_denied/i, `CONNECT ${authority}: X-Paygate-Error`)
      t.match(r.all, /"error":"egress_denied"/)
    }
  }
  // A WebSocket upgrade to the RPC (anvil speaks JSON-RPC over WebSocket on the same port).
  for (const host of ['127.1', 'localhost']) {
    const target = `http://${host}:${rpcPort}/`
    const r = await raw(proxyPort, (_s, head) =>
      head === ''
        ? `GET ${target} HTTP/1.1\r\nHost: ${host}:${rpcPort}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nProxy-Authorization: ${attacker.auth}\r\n\r\n`
        : null,
    )
    t.equal(statusOf(r.head), 403, `WebSocket upgrade to ${host}: 403`)
    t.match(r.head, /x-paygate-error: egress_denied/i)
  }
  await fundsUntouched(t)
})

t.test("Paygate's API and proxy ports are refused, loopback on other ports is not", async (t) => {
  for (const [name, port] of [
    ['API', apiPort],
    ['proxy', proxyPort],
  ] as const) {
    for (const host of ['127.0.0.1', 'localhost', '0.0.0.0', '[::ffff:127.0.0.1]']) {
      const url = `http://${host}:${port}/healthz`
      refusedAt(t, await gw.api('POST', '/v1/pay', { key: attacker.key, body: { agentId: 'attacker', endpoint: url, method: 'GET' } }), `pay to the ${name} port at ${host}`)
      refusedAt(t, await viaProxy(gw, attacker.auth, 'GET', url), `proxy to the ${name} port at ${host}`)
    }
    const r = await tunnel(attacker.auth, `127.0.0.1:${port}`, null)
    t.equal(statusOf(r.head), 403, `CONNECT to the ${name} port: 403`)
  }
  const seen = plainHits
  const ok = await gw.api('POST', '/v1/pay', { key: attacker.key, body: { agentId: 'attacker', endpoint: `http://localhost:${plainPort}/`, method: 'GET' } })
  t.equal(ok.status, 200, ok.text)
  t.same(ok.body.data, { ok: true })
  t.equal((await viaProxy(gw, attacker.auth, 'GET', `http://127.1:${plainPort}/`)).status, 200, 'loopback on another port, by the proxy')
  t.equal(plainHits, seen + 2)
})

t.test('private ranges and metadata are refused before any connection is attempted', async (t) => {
  const from = attempts.length
  asked.length = 0
  const cases: [url: string, reason: string][] = [
    ['http://10.1.2.3:8080/', 'private'],
    ['http://192.168.1.10/', 'private'],
    ['http://172.16.0.1/', 'private'],
    ['http://100.64.0.1/', 'private'],
    ['http://[fd12:3456::1]/', 'private'],
    ['http://intranet.test/', 'private'],
    ['http://mixed.test/', 'private'],
    ['http://169.254.169.254/latest/meta-data/', 'link_local'],
    ['http://imds.test/latest/meta-data/', 'link_local'],
    ['http://[fe80::1]/', 'link_local'],
    ['http://[fd00:ec2::254]/latest/meta-data/', 'metadata'],
    ['http://100.100.100.200/latest/meta-data/', 'metadata'],
    ['http://metadata.google.internal/computeMetadata/v1/', 'metadata'],
    ['http://metadata/computeMetadata/v1/', 'metadata'],
    ['http://instance-data/latest/', 'metadata'],
    ['http://224.0.0.1/', 'reserved'],
  ]
  for (const [url, reason] of cases) {
    const r = await gw.api('POST', '/v1/pay', { key: attacker.key, body: { agentId: 'attacker', endpoint: url, method: 'GET' } })
    refusedAt(t, r, `pay ${url}`)
    t.equal(r.body.reason, reason, `${url}: ${reason}`)
    const p = await viaProxy(gw, attacker.auth, 'GET', url)
    refusedAt(t, p, `proxy ${url}`)
    // An intercepted CONNECT is refused at once when the host alone decides (a name is checked when a request inside connects).
    const u = new URL(url)
    if (u.hostname.endsWith('.test')) continue
    const c = await tunnel(attacker.auth, u.port ? u.host : `${u.host}:80`, null)
    t.equal(statusOf(c.head), 403, `CONNECT ${u.host}: refused at once`)
  }
  t.same(
    attempts.slice(from).filter((a) => !loopback(a.address)),
    [],
    'no connection attempt beyond loopback',
  )
  t.notOk(
    asked.some((h) => h.startsWith('metadata') || h === 'instance-data'),
    'metadata names are refused without even being resolved',
  )
})

t.test('a refusal names the range of a resolved name, not the address', async (t) => {
  const r = await gw.api('POST', '/v1/pay', { key: attacker.key, body: { agentId: 'attacker', endpoint: 'http://intranet.test:8080/x', method: 'GET' } })
  refusedAt(t, r, 'intranet.test')
  t.match(r.body.detail, /intranet\.test:8080.*10\.0\.0\.0\/8.*egress\.allow/)
  t.notMatch(r.body.detail, /10\.1\.2\.3/)
  t.ok(
    gw.logs.some((l) => l.includes('"address":"10.1.2.3"')),
    'the log has the address',
  )
})

t.test('DNS rebinding: a connection goes to the address that was checked, and a new one is checked again', async (t) => {
  for (const [path, name] of [
    ['pay', 'rebind-pay.test'],
    ['proxy', 'rebind-proxy.test'],
  ] as const) {
    // The first answer is the allowed 127.0.0.1; every later one the denied 127.0.0.2.
    names[name] = [[{ address: '127.0.0.1', family: 4 }], [{ address: '127.0.0.2', family: 4 }]]
    asked.length = 0
    hits.checked = hits.other = 0
    const url = `http://${name}:${rebindPort}/`
    const send = (): Promise<{ status: number; body: any; headers: IncomingHttpHeaders | Headers }> =>
      path === 'pay' ? gw.api('POST', '/v1/pay', { key: attacker.key, body: { agentId: 'attacker', endpoint: url, method: 'GET' } }) : viaProxy(gw, attacker.auth, 'GET', url)
    const first = await send()
    t.equal(first.status, 200, `${path}: the checked address answers`)
    t.same(path === 'pay' ? first.body.data : first.body, { served: 'checked' })
    t.same(asked, [name], `${path}: resolved once for the connection`)
    t.same(hits, { checked: 1, other: 0 }, `${path}: nothing reached the other address`)
    // The target closed that connection: the next one resolves again, and the new answer is refused.
    const second = await send()
    refusedAt(t, second, `${path}: the rebound answer`)
    t.same(asked, [name, name], `${path}: one resolution per connection`)
    t.same(hits, { checked: 1, other: 0 }, `${path}: still nothing at the other address`)
  }
})

t.test('a name the resolver maps to IPv4-mapped loopback is loopback', async (t) => {
  refusedAt(
    t,
    await gw.api('POST', '/v1/pay', { key: attacker.key, body: { agentId: 'attacker', endpoint: `http://mapped.test:${rpcPort}/`, method: 'POST', body: theft[0] } }),
    'mapped.test on the RPC port',
  )
  await fundsUntouched(t)
})

t.test('egress.allow opens a private range (the decision: no traffic leaves loopback), egress.deny closes a loopback port', async (t) => {
  const gw2 = await startTestGateway({
    env: { PAYGATE_EGRESS_ALLOW: '10.1.2.0/24,0.0.0.0/0,::/0,metadata.google.internal,127.0.0.0/8', PAYGATE_EGRESS_DENY: `127.0.0.1:${plainPort}` },
    options: { resolver },
  })
  t.teardown(() => gw2.close())
  const g = gw2.gw.egress
  t.same(await g.check('10.1.2.3', 8080), [{ address: '10.1.2.3', family: 4 }], 'a private address in egress.allow')
  t.same(await g.check('intranet.test', 80), [{ address: '10.1.2.3', family: 4 }], 'a name resolving into it')
  // The first gateway refuses the same (default).
  await t.rejects(gw.gw.egress.check('intranet.test', 80), { code: 'egress_denied' })
  // The always-denied list stays closed whatever egress.allow says.
  const chainPort = Number(new URL((await gw2.api('GET', '/v1/chain')).body.rpcUrl).port)
  for (const [host, port] of [
    ['169.254.169.254', 80],
    ['metadata.google.internal', 80],
    ['[fd00:ec2::254]', 80],
    ['127.0.0.1', chainPort],
    ['0x7f000001', chainPort],
    ['127.0.0.1', Number(new URL(gw2.gw.apiUrl).port)],
    ['[::ffff:127.0.0.1]', Number(new URL(gw2.gw.proxyUrl).port)],
  ] as const) {
    await t.rejects(g.check(host, port), { code: 'egress_denied' }, `${host}:${port} stays denied`)
  }
  // egress.deny of a loopback port: refused in every spelling, by every path; nothing reaches the server.
  const seen = plainHits
  const { key, auth } = await agent(gw2, 'deny-tester')
  for (const host of ['127.0.0.1', 'localhost', '127.1', '[::ffff:127.0.0.1]']) {
    const url = `http://${host}:${plainPort}/`
    const r = await gw2.api('POST', '/v1/pay', { key, body: { agentId: 'deny-tester', endpoint: url, method: 'GET' } })
    refusedAt(t, r, `pay ${url}`)
    t.equal(r.body.reason, 'deny_list')
    refusedAt(t, await viaProxy(gw2, auth, 'GET', url), `proxy ${url}`)
  }
  t.equal(plainHits, seen, 'the denied port saw no request')
  // Another loopback port stays open.
  hits.checked = hits.other = 0
  const open = await gw2.api('POST', '/v1/pay', { key, body: { agentId: 'deny-tester', endpoint: `http://127.0.0.1:${rebindPort}/`, method: 'GET' } })
  t.equal(open.status, 200, open.text)
})

t.test('a blockedDomains entry 127.0.0.1 also blocks [::ffff:127.0.0.1] and [::ffff:7f00:1]', async (t) => {
  const chain = await testChain(gw)
  const m = await startV2Merchant(await chain.merchantOptions(10_000n))
  t.teardown(() => m.close())
  const { key, address } = await agent(gw, 'blocked-loopback')
  t.equal((await gw.api('PUT', '/v1/policies/blocked-loopback', { body: { blockedDomains: ['127.0.0.1'] } })).status, 200)
  const before = await balanceOf(address)
  const port = new URL(m.url).port
  for (const host of ['[::ffff:127.0.0.1]', '[::ffff:7f00:1]', '127.0.0.1']) {
    const r = await gw.api('POST', '/v1/pay', { key, body: { agentId: 'blocked-loopback', endpoint: `http://${host}:${port}/paid`, method: 'GET' } })
    t.equal(r.status, 402, `${host}: ${r.text}`)
    t.match(r.body, { error: 'policy_violation', reason: 'domain_blocked' })
  }
  // An entry written as a mapped address is stored as its IPv4 address.
  t.equal((await gw.api('PUT', '/v1/policies/blocked-loopback', { body: { blockedDomains: ['::ffff:127.0.0.1'] } })).status, 200)
  t.same((await gw.api('GET', '/v1/policies/blocked-loopback')).body.blockedDomains, ['127.0.0.1'])
  const r = await gw.api('POST', '/v1/pay', { key, body: { agentId: 'blocked-loopback', endpoint: `http://[::ffff:127.0.0.1]:${port}/paid`, method: 'GET' } })
  t.match(r.body, { error: 'policy_violation', reason: 'domain_blocked' })
  t.equal(await balanceOf(address), before, 'nothing paid')
  t.equal(m.stats.settlements, 0)
})

t.test('no connection attempt in this file left loopback', async (t) => {
  t.ok(attempts.length > 0, 'attempts were watched')
  t.same(
    attempts.filter((a) => !loopback(a.address)),
    [],
  )
})
