import t from 'tap'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { call, spawnGateway } from '../helpers/process.js'
import { ProxyAgent, request } from 'undici'
import { WebSocketServer } from 'ws'
import { startTestGateway, tempDir } from '../helpers/gateway.js'

/** Streaming through the proxy, WebSocket upgrades, plain HTTP inside CONNECT, the sidecar agent, CA reuse. */
const dataDir = tempDir()
const gw = await startTestGateway({ dataDir, env: { PAYGATE_PROXY_DEFAULT_AGENT: 'sidecar' } })
t.teardown(async () => {
  await gw.close()
  rmSync(dataDir, { recursive: true, force: true })
})
const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'sidecar' } })).body.apiKey as string
const basic = `Basic ${Buffer.from(`sidecar:${key}`).toString('base64')}`

const listen = async (s: Server): Promise<string> => {
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => s.close(() => r())))
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`
}

const SIZE = 50 * 1024 * 1024
const chunk = Buffer.alloc(64 * 1024, 7)
const big = await listen(
  createServer((req, res) => {
    const size = Number(new URL(req.url ?? '/', 'http://x').searchParams.get('bytes') ?? SIZE)
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': size })
    let sent = 0
    const pump = (): void => {
      while (sent < size) {
        sent += chunk.length
        if (!res.write(chunk)) {
          res.once('drain', pump)
          return
        }
      }
      res.end()
    }
    pump()
  }),
)

t.test('a 50 MB download streams through without sitting in memory', async (t) => {
  // The gateway in its own process, so its peak RSS (VmHWM) is its own.
  const dir = tempDir()
  const child = await spawnGateway({ PAYGATE_DATA_DIR: dir, PAYGATE_PROXY_DEFAULT_AGENT: 'sidecar' })
  t.teardown(async () => {
    await child.stop('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  })
  const acct = readFileSync(join(dir, 'account-key'), 'utf8').trim()
  await call(child.url, 'POST', '/v1/agents', acct, { agentId: 'sidecar' })
  const proxyUrl = child.stdout.map((l) => JSON.parse(l)).find((j) => j.msg === 'paygate started').proxy as string
  const hwm = (): number => Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${child.proc.pid}/status`, 'utf8'))![1]) / 1024
  const download = async (agent: ProxyAgent, bytes: number): Promise<number> => {
    const r = await request(`${big}/file?bytes=${bytes}`, { dispatcher: agent })
    t.equal(r.statusCode, 200)
    let got = 0
    for await (const c of r.body) got += (c as Buffer).length
    return got
  }
  // Absolute-form (HTTP_PROXY for http:// targets).
  const plain = new ProxyAgent({ uri: proxyUrl, proxyTunnel: false } as never)
  t.teardown(() => plain.close())
  // The first large body sets the process's working set (~55 MB here, whatever the size: heap
  // and buffer pools); after it, a body that were held whole would push the peak up by its size.
  await download(plain, SIZE)
  let base = hwm()
  t.equal(await download(plain, SIZE), SIZE)
  let growth = hwm() - base
  t.ok(growth < 25, `absolute-form: gateway peak RSS grew ${growth.toFixed(1)} MB while 50 MB streamed through`)
  // Through a CONNECT tunnel, three times the body.
  const tunnel = new ProxyAgent({ uri: proxyUrl })
  t.teardown(() => tunnel.close())
  base = hwm()
  t.equal(await download(tunnel, 3 * SIZE), 3 * SIZE)
  growth = hwm() - base
  t.ok(growth < 25, `CONNECT: gateway peak RSS grew ${growth.toFixed(1)} MB while 150 MB streamed through`)
})

t.test('plain HTTP inside CONNECT (undici tunnels http:// targets) works', async (t) => {
  const agent = new ProxyAgent({ uri: gw.gw.proxyUrl, token: basic })
  t.teardown(() => agent.close())
  const echo = await listen(createServer((req, res) => res.end(`${req.method} ${req.url} proxy-auth:${req.headers['proxy-authorization'] ?? 'none'}`)))
  const r = await request(`${echo}/hello?x=1`, { dispatcher: agent })
  t.equal(await r.body.text(), 'GET /hello?x=1 proxy-auth:none', 'Proxy-Authorization never reaches the target')
})

t.test('sidecar mode: no credentials uses the default agent', async (t) => {
  const echo = await listen(createServer((_req, res) => res.end('hi')))
  const agent = new ProxyAgent({ uri: gw.gw.proxyUrl })
  t.teardown(() => agent.close())
  const r = await request(`${echo}/`, { dispatcher: agent })
  t.equal(r.statusCode, 200)
  t.equal(await r.body.text(), 'hi')
  t.ok(
    gw.logs.some((l) => l.includes('"msg":"proxy request"') && l.includes('"agentId":"sidecar"')),
    'logged as the default agent',
  )
})

t.test('proxy.accessLog false: requests are served without their info line; a failure is still logged', async (t) => {
  const dir = tempDir()
  const quiet = await startTestGateway({ dataDir: dir, env: { PAYGATE_PROXY_DEFAULT_AGENT: 'sidecar', PAYGATE_PROXY_ACCESS_LOG: 'false' } })
  t.teardown(async () => {
    await quiet.close()
    rmSync(dir, { recursive: true, force: true })
  })
  await quiet.api('POST', '/v1/agents', { body: { agentId: 'sidecar' } })
  const echo = await listen(createServer((_req, res) => res.end('quiet')))
  const agent = new ProxyAgent({ uri: quiet.gw.proxyUrl, proxyTunnel: false } as never)
  t.teardown(() => agent.close())
  const r = await request(`${echo}/`, { dispatcher: agent })
  t.equal(await r.body.text(), 'quiet')
  t.ok(
    quiet.logs.some((l) => l.includes('"msg":"chain ready"')),
    'the gateway still logs at info',
  )
  t.notOk(
    quiet.logs.some((l) => l.includes('"msg":"proxy request"')),
    'no line per proxied request',
  )
  // A failure (and a payment) keeps its line: the target's port is closed now.
  const probe = createServer()
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r))
  const closedPort = (probe.address() as AddressInfo).port
  await new Promise<void>((r) => probe.close(() => r()))
  const failed = await request(`http://127.0.0.1:${closedPort}/`, { dispatcher: agent })
  await failed.body.dump()
  t.equal(failed.statusCode, 502)
  t.ok(
    quiet.logs.some((l) => l.includes('"msg":"proxy request"') && l.includes('"error":"upstream_unreachable"')),
    'the failed request is logged',
  )
  // The same request through a gateway with the default config is logged.
  const loud = new ProxyAgent({ uri: gw.gw.proxyUrl, proxyTunnel: false } as never)
  t.teardown(() => loud.close())
  await (await request(`${echo}/`, { dispatcher: loud })).body.text()
  const host = new URL(echo).host
  t.ok(
    gw.logs.some((l) => l.includes('"msg":"proxy request"') && l.includes(`"host":"${host}"`)),
    'logged by default',
  )
})

t.test('WebSocket echo through the proxy', async (t) => {
  const srv = createServer()
  const wss = new WebSocketServer({ server: srv })
  wss.on('connection', (ws) => ws.on('message', (m) => ws.send(`echo:${String(m)}`)))
  const base = await listen(srv)
  t.teardown(() => wss.close())
  const proxied = await new Promise<string>((resolve, reject) => {
    const p = new URL(gw.gw.proxyUrl)
    // ws has no proxy support of its own: open the upgrade with an absolute-form path by hand.
    import('node:http').then(({ request: req }) => {
      const r = req({
        host: p.hostname,
        port: p.port,
        path: `${base}/chat`,
        headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-version': '13', 'sec-websocket-key': Buffer.from('0123456789abcdef').toString('base64'), 'proxy-authorization': basic },
      })
      r.on('upgrade', (_res, socket) => {
        // One masked text frame "ping", then read the echo frame.
        const payload = Buffer.from('ping')
        const mask = Buffer.from([1, 2, 3, 4])
        const frame = Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, Buffer.from(payload.map((b, i) => b ^ mask[i % 4]!))])
        socket.write(frame)
        socket.once('data', (d: Buffer) => {
          resolve(d.subarray(2, 2 + (d[1]! & 0x7f)).toString())
          socket.destroy()
        })
      })
      r.on('error', reject)
      r.end()
    }, reject)
  })
  t.equal(proxied, 'echo:ping')
})

t.test('restart: the same CA is reused', async (t) => {
  const before = gw.gw.ca.certPem
  const { CertificateAuthority } = await import('../../src/proxy/ca.js')
  const again = await CertificateAuthority.load(gw.gw.config.certsDir)
  t.equal(again.certPem, before)
  t.equal((await gw.api('GET', '/v1/ca.pem', { key: null })).text, before, 'GET /v1/ca.pem serves it')
})
