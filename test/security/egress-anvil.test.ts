import t from 'tap'
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { request as httpRequest } from 'node:http'
import { join } from 'node:path'
import { startTestGateway } from '../helpers/gateway.js'

/**
 * The embedded chain's anvil serves HTTP JSON-RPC on a port of its own (besides the IPC socket
 * Paygate uses, and the chain's port Paygate fronts it with), with the same dev methods
 * (`anvil_setBalance`, `anvil_impersonateAccount`, ...). docs/security.md: "Paygate never
 * connects to it ... for an agent". That port is refused like the chain's own, through the
 * proxy and POST /v1/pay.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const anvilPid = Number(readFileSync(join(gw.dataDir, 'chain', 'anvil.pid'), 'utf8').split('\n')[0])
// Found here without Paygate's code: the ports `ss` lists for anvil's pid.
const anvilPorts = execFileSync('ss', ['-ltnpH'], { encoding: 'utf8' })
  .split('\n')
  .filter((l) => l.includes(`pid=${anvilPid},`))
  .map((l) => Number(/:(\d+)$/.exec(l.split(/\s+/)[3] ?? '')?.[1]))
const chainPort = Number(new URL((await gw.api('GET', '/v1/chain')).body.rpcUrl).port)
const port = anvilPorts.find((p) => p !== chainPort)

const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'thief' } })).body.apiKey as string
const auth = `Basic ${Buffer.from(`thief:${key}`).toString('base64')}`
const victim = '0x00000000000000000000000000000000000000aa'
const call = { jsonrpc: '2.0', id: 1, method: 'anvil_setBalance', params: [victim, '0x1000'] }
const proxyPort = Number(new URL(gw.gw.proxyUrl).port)

/** One absolute-form POST through the proxy. */
function viaProxy(target: string): Promise<{ status: number; header: string | undefined; body: string }> {
  return new Promise((resolve, reject) => {
    const text = JSON.stringify(call)
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port: proxyPort,
        method: 'POST',
        path: target,
        headers: { host: new URL(target).host, 'proxy-authorization': auth, 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) },
      },
      (res) => {
        let body = ''
        res.setEncoding('utf8')
        res.on('data', (c: string) => (body += c))
        res.on('end', () => resolve({ status: res.statusCode ?? 0, header: res.headers['x-paygate-error'] as string | undefined, body }))
      },
    )
    req.on('error', reject)
    req.end(text)
  })
}

const balance = async (): Promise<string> => {
  const r = await fetch(`http://127.0.0.1:${chainPort}/`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_getBalance', params: [victim, 'latest'] }),
  })
  return ((await r.json()) as { result: string }).result
}

t.test("anvil's own port is refused as one of Paygate's listeners", async (t) => {
  t.ok(port, `anvil (pid ${anvilPid}) listens on a TCP port of its own: ${anvilPorts}`)
  for (const host of ['127.0.0.1', 'localhost', '127.1']) {
    const r = await viaProxy(`http://${host}:${port}/`)
    t.equal(r.status, 403, `proxy to ${host}:${port}: ${r.body.slice(0, 200)}`)
    t.equal(r.header, 'egress_denied')
    t.match(JSON.parse(r.body), { error: 'egress_denied', reason: 'own_listener' })
  }
  const api = await gw.api('POST', '/v1/pay', { key, body: { agentId: 'thief', endpoint: `http://127.0.0.1:${port}/`, method: 'POST', body: call } })
  t.equal(api.status, 403, api.text)
  t.match(api.body, { error: 'egress_denied', reason: 'own_listener' })
  t.equal(await balance(), '0x0', 'no balance was set')
})
