import t from 'tap'
import { execFile } from 'node:child_process'
import { createServer as createHttpServer, request as httpRequest, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import { promisify } from 'node:util'
import { ProxyAgent, request } from 'undici'
import type { Hex } from 'viem'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { interceptionTestbed } from '../helpers/tls-front.js'
import { startV1Merchant, startV2Merchant, type Merchant } from '../helpers/merchants.js'

const run = promisify(execFile)

/** One absolute-form request straight to the proxy port. */
function absoluteForm(url: string, headers: Record<string, string>): Promise<{ status: number; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const p = new URL(gw.gw.proxyUrl)
    const req = httpRequest({ host: p.hostname, port: p.port, path: url, headers }, (res) => {
      res.resume()
      resolve({ status: res.statusCode ?? 0, headers: res.headers })
    })
    req.on('error', reject)
    req.end()
  })
}

/** Unmodified clients pay through the proxy: HTTPS intercepted, loopback merchants behind TLS. */
const { upstreamCaFile, gw, caFile, proxyPort, closers, httpsOf } = await interceptionTestbed(t)
const { balanceOf, merchantOptions } = await testChain(gw)

async function merchant(kind: 'v1' | 'v2'): Promise<{ m: Merchant; https: string; payTo: Hex }> {
  const opts = await merchantOptions(5_000n)
  const m = kind === 'v2' ? await startV2Merchant(opts) : await startV1Merchant(opts)
  closers.push(() => m.close())
  return { m, https: await httpsOf(m), payTo: opts.payTo }
}

const agentKey = (await gw.api('POST', '/v1/agents', { body: { agentId: 'px' } })).body.apiKey as string
const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: 'px' } })).body.address as Hex
const basic = `Basic ${Buffer.from(`px:${agentKey}`).toString('base64')}`
const proxyAgent = new ProxyAgent({ uri: gw.gw.proxyUrl, token: basic, requestTls: { ca: (await gw.api('GET', '/v1/ca.pem', { key: null })).text } })
closers.push(() => proxyAgent.close())

const v2 = await merchant('v2')
const v1 = await merchant('v1')

t.test('undici ProxyAgent: a plain page, then paid v2 and v1 merchants over intercepted HTTPS', async (t) => {
  const free = await request(`${v2.https}/free`, { dispatcher: proxyAgent })
  t.equal(free.statusCode, 200)
  t.notOk(free.headers['x-paygate-tx'], 'nothing paid for a free page')
  await free.body.dump()
  for (const { m, https, payTo } of [v2, v1]) {
    const before = await balanceOf(wallet)
    const r = await request(`${https}/paid`, { dispatcher: proxyAgent, headers: { accept: 'application/json' } })
    const body = await r.body.json()
    t.equal(r.statusCode, 200, m.kind)
    t.match(body, { ok: true })
    t.match(r.headers['x-paygate-tx'], /^0x[0-9a-f]{64}$/)
    t.equal(r.headers['x-paygate-amount'], '0.005')
    t.equal(await balanceOf(payTo), 5_000n, `${m.kind}: merchant paid on chain`)
    t.equal(await balanceOf(wallet), before - 5_000n)
  }
})

t.test('curl through the proxy with --cacert pays', async (t) => {
  const { stdout } = await run('curl', ['-s', '-i', '--max-time', '20', '-x', `http://px:${agentKey}@127.0.0.1:${proxyPort}`, '--cacert', caFile, `${v2.https}/paid`])
  t.match(stdout, /^HTTP\/1\.1 200/)
  t.match(stdout, /x-paygate-tx: 0x[0-9a-f]{64}/i)
  t.match(stdout, /x-paygate-amount: 0\.005/i)
  t.match(stdout, /"ok":true/)
  const plain = await run('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', '-x', `http://127.0.0.1:${proxyPort}`, `${v2.m.url}/free`])
  t.equal(plain.stdout, '407', 'no credentials: 407')
})

t.test('Python requests with REQUESTS_CA_BUNDLE pays', async (t) => {
  const script = `import requests, sys\nr = requests.get(sys.argv[1], proxies={'https': sys.argv[2], 'http': sys.argv[2]}, timeout=20)\nprint(r.status_code, r.headers.get('X-Paygate-Amount'), r.json()['ok'])`
  // The first interpreter on PATH may be a separate install (pyenv); Debian's python3-requests serves /usr/bin/python3.
  let python = ''
  for (const cand of ['python3', '/usr/bin/python3']) {
    if (
      await run(cand, ['-c', 'import requests']).then(
        () => true,
        () => false,
      )
    ) {
      python = cand
      break
    }
  }
  t.ok(python, 'a python3 with requests (.ci/run installs python3-requests when none has it)')
  const { stdout } = await run(python, ['-c', script, `${v1.https}/paid`, `http://px:${agentKey}@127.0.0.1:${proxyPort}`], { env: { ...process.env, REQUESTS_CA_BUNDLE: caFile, NO_PROXY: '' } })
  t.equal(stdout.trim(), '200 0.005 True')
})

t.test('407 with Proxy-Authenticate for missing or wrong credentials', async (t) => {
  for (const auth of [undefined, `Basic ${Buffer.from(`px:rp_agent_${'x'.repeat(40)}`).toString('base64')}`, `Basic ${Buffer.from(`other:${agentKey}`).toString('base64')}`]) {
    const r = await absoluteForm(`${v2.m.url}/free`, auth ? { 'proxy-authorization': auth } : {})
    t.equal(r.status, 407)
    t.equal(r.headers['proxy-authenticate'], 'Basic realm="paygate"')
  }
})

t.test('a revoked key stops working on the proxy at once (identities are cached per header)', async (t) => {
  const issued = (await gw.api('POST', '/v1/agents', { body: { agentId: 'px-revoked' } })).body
  const auth = { 'proxy-authorization': `Basic ${Buffer.from(`px-revoked:${issued.apiKey}`).toString('base64')}` }
  t.equal((await absoluteForm(`${v2.m.url}/free`, auth)).status, 200)
  t.equal((await absoluteForm(`${v2.m.url}/free`, auth)).status, 200, 'again, from the cache')
  t.equal((await gw.api('DELETE', `/v1/keys/${issued.keyId}`)).status, 200)
  t.equal((await absoluteForm(`${v2.m.url}/free`, auth)).status, 407)
})

t.test('a policy rejection reaches the client as 402 with X-Paygate-Error', async (t) => {
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'px-capped' } })).body.apiKey
  await gw.api('POST', '/v1/wallets', { body: { agentId: 'px-capped' } })
  await gw.api('PUT', '/v1/policies/px-capped', { body: { perCallLimit: { usdc: 0.001 } } })
  const capped = new ProxyAgent({
    uri: gw.gw.proxyUrl,
    token: `Basic ${Buffer.from(`px-capped:${key}`).toString('base64')}`,
    requestTls: { ca: (await gw.api('GET', '/v1/ca.pem', { key: null })).text },
  })
  t.teardown(() => capped.close())
  const r = await request(`${v2.https}/paid`, { dispatcher: capped })
  t.equal(r.statusCode, 402)
  t.equal(r.headers['x-paygate-error'], 'policy_violation')
  t.match(await r.body.json(), { error: 'policy_violation', reason: 'per_call_limit_exceeded' })
})

t.test('a POST body is resent intact on the paid retry; Paygate headers never reach the target', async (t) => {
  const payload = JSON.stringify({ data: 'x'.repeat(10_000), n: 42 })
  const r = await request(`${v2.https}/paid`, {
    dispatcher: proxyAgent,
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-paygate-idempotency-key': 'post-1' },
    body: payload,
  })
  t.equal(r.statusCode, 200)
  t.equal(await r.body.text(), payload)
  // A retry from an HTTP stack that adds its own per-attempt headers is the same request.
  const retryHeaders = { 'content-type': 'application/json', 'x-paygate-idempotency-key': 'post-1', traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', 'x-retry-count': '1' }
  const again = await request(`${v2.https}/paid`, { dispatcher: proxyAgent, method: 'POST', headers: retryHeaders, body: payload })
  t.equal(again.statusCode, 200)
  t.equal(again.headers['x-paygate-tx'], r.headers['x-paygate-tx'], 'the idempotent replay pays nothing new')
  await again.body.dump()
})

t.test('a 402 Paygate cannot pay passes through with X-Paygate-Error', async (t) => {
  const odd = createHttpServer((_req, res) => {
    res.writeHead(402, { 'content-type': 'text/plain' })
    res.end('pay me in seashells')
  })
  await new Promise<void>((r) => odd.listen(0, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => odd.close(() => r())))
  const r = await request(`http://127.0.0.1:${(odd.address() as AddressInfo).port}/`, { dispatcher: proxyAgent })
  t.equal(r.statusCode, 402)
  t.equal(r.headers['x-paygate-error'], 'payment_protocol_error')
  t.equal(await r.body.text(), 'pay me in seashells', 'the body passes through unchanged')
})

t.test('the second CONNECT to a host reuses the cached leaf', async (t) => {
  const before = gw.gw.ca.stats()
  const agent = new ProxyAgent({ uri: gw.gw.proxyUrl, token: basic, requestTls: { ca: gw.gw.ca.certPem } })
  await (await request(`${v1.https}/free`, { dispatcher: agent })).body.dump()
  await agent.close()
  const mid = gw.gw.ca.stats()
  const agent2 = new ProxyAgent({ uri: gw.gw.proxyUrl, token: basic, requestTls: { ca: gw.gw.ca.certPem } })
  await (await request(`${v1.https}/free`, { dispatcher: agent2 })).body.dump()
  await agent2.close()
  const after = gw.gw.ca.stats()
  t.equal(after.misses, mid.misses, 'no new certificate minted for the second CONNECT')
  t.ok(after.hits > mid.hits)
  t.ok(mid.misses - before.misses <= 1)
})

t.test('Node recipe: NODE_EXTRA_CA_CERTS plus undici EnvHttpProxyAgent, in a fresh process', async (t) => {
  const script = `
    const { EnvHttpProxyAgent, setGlobalDispatcher } = require('undici')
    setGlobalDispatcher(new EnvHttpProxyAgent())
    fetch(process.argv[1]).then(async (r) => console.log(r.status, r.headers.get('x-paygate-amount'), (await r.json()).ok))
  `
  const { stdout } = await run(process.execPath, ['-e', script, `${v2.https}/paid`], {
    env: { PATH: process.env.PATH ?? '', NODE_EXTRA_CA_CERTS: caFile, HTTPS_PROXY: `http://px:${agentKey}@127.0.0.1:${proxyPort}`, NO_PROXY: '' },
    cwd: process.cwd(),
  })
  t.equal(stdout.trim(), '200 0.005 true')
})

t.test('a body over proxy.maxBufferBytes streams once; its 402 comes back unpaid, saying why', async (t) => {
  const g = await startTestGateway({ env: { PAYGATE_PROXY_MAX_BUFFER_BYTES: '1024', PAYGATE_CHAIN_CHAIN_ID: '84532', PAYGATE_UPSTREAM_CA_FILE: upstreamCaFile } })
  t.teardown(() => g.close())
  const k = (await g.api('POST', '/v1/agents', { body: { agentId: 'big' } })).body.apiKey
  const agent = new ProxyAgent({ uri: g.gw.proxyUrl, token: `Basic ${Buffer.from(`big:${k}`).toString('base64')}`, proxyTunnel: false } as never)
  t.teardown(() => agent.close())
  const r = await request(`${v2.m.url}/paid`, { dispatcher: agent, method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ pad: 'x'.repeat(5000) }) })
  t.equal(r.statusCode, 402)
  t.equal(r.headers['x-paygate-error'], 'request_body_too_large')
  await r.body.dump()
})

t.test('paying inside a CONNECT tunnel to a plain-HTTP port (undici tunnels http:// targets)', async (t) => {
  const before = await balanceOf(v2.payTo)
  const r = await request(`${v2.m.url}/paid`, { dispatcher: proxyAgent })
  t.equal(r.statusCode, 200)
  t.match(r.headers['x-paygate-tx'], /^0x[0-9a-f]{64}$/)
  t.match(await r.body.json(), { ok: true })
  t.equal(await balanceOf(v2.payTo), before + 5_000n)
})

t.test('X-Paygate-Idempotency-Key and an answer over the size kept for replays (8 MiB)', async (t) => {
  // A front for a v2 merchant whose paid answer is 9 MiB (the merchant's own are small): the
  // 402 and the payment pass through it; `/free-big` is 9 MiB for nothing.
  const SIZE = 9 * 1024 * 1024
  const { m, payTo } = await merchant('v2')
  const mport = Number(new URL(m.url).port)
  let freeCalls = 0
  const front = createHttpServer((req, res) => {
    if (req.url === '/free-big') {
      freeCalls++
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': SIZE })
      res.end(Buffer.alloc(SIZE, 'f'))
      return
    }
    const up = httpRequest({ host: '127.0.0.1', port: mport, path: '/paid', method: req.method, headers: req.headers }, (ur) => {
      if (ur.statusCode !== 200) {
        res.writeHead(ur.statusCode ?? 502, ur.headers)
        ur.pipe(res)
        return
      }
      ur.resume()
      const { 'content-length': _cl, 'transfer-encoding': _te, ...h } = ur.headers
      res.writeHead(200, { ...h, 'content-type': 'application/octet-stream', 'content-length': SIZE })
      res.end(Buffer.alloc(SIZE, 'p'))
    })
    up.on('error', () => res.destroy())
    req.pipe(up)
  })
  await new Promise<void>((r) => front.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    front.closeAllConnections()
    return new Promise<void>((r) => front.close(() => r()))
  })
  const base = `http://127.0.0.1:${(front.address() as AddressInfo).port}`
  const size = async (body: AsyncIterable<unknown>): Promise<number> => {
    let n = 0
    for await (const c of body) n += (c as Buffer).length
    return n
  }

  // Nothing paid: the answer streams through and is not kept; the same key asks the target again.
  for (let i = 1; i <= 2; i++) {
    const r = await request(`${base}/free-big`, { dispatcher: proxyAgent, headers: { 'x-paygate-idempotency-key': 'big-free' } })
    t.equal(r.statusCode, 200, `unpaid, call ${i}`)
    t.equal(r.headers['x-paygate-error'], undefined)
    t.equal(await size(r.body), SIZE, `unpaid, call ${i}: every byte`)
    t.equal(freeCalls, i, `unpaid, call ${i}: asked the target`)
  }

  // Paid: this call gets the answer; the key keeps the payment and says the body is not kept.
  const before = await balanceOf(payTo)
  const r = await request(`${base}/paid`, { dispatcher: proxyAgent, headers: { 'x-paygate-idempotency-key': 'big-paid' } })
  t.equal(r.statusCode, 200)
  const tx = r.headers['x-paygate-tx']
  t.match(tx, /^0x[0-9a-f]{64}$/)
  t.equal(r.headers['x-paygate-amount'], '0.005')
  t.equal(await size(r.body), SIZE, 'the paid answer, every byte')
  t.equal(await balanceOf(payTo), before + 5_000n, 'paid once on chain')
  for (let i = 1; i <= 2; i++) {
    const again = await request(`${base}/paid`, { dispatcher: proxyAgent, headers: { 'x-paygate-idempotency-key': 'big-paid' } })
    t.equal(again.statusCode, 502, `replay ${i}`)
    t.equal(again.headers['x-paygate-error'], 'upstream_body_too_large')
    t.equal(again.headers['x-paygate-tx'], tx, `replay ${i}: the payment made`)
    t.equal(again.headers['x-paygate-amount'], '0.005')
    t.match(await again.body.json(), { error: 'upstream_body_too_large', status: 200, txHash: tx, detail: /8388608 bytes/ })
  }
  t.equal(await balanceOf(payTo), before + 5_000n, 'replays pay nothing')
})
