import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Pool } from 'undici'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { startTestGateway } from './test/helpers/gateway.js'
const gw = await startTestGateway({ env: { PAYGATE_LOG_LEVEL: 'warn', PAYGATE_API_RATE_LIMIT_PER_MINUTE: '10000000', PAYGATE_API_RATE_LIMIT_BURST: '10000000' } })
const info = (await gw.api('GET', '/v1/chain')).body
const payTo = privateKeyToAccount(generatePrivateKey()).address
let required = ''
const merchant = createServer((req, res) => {
  if (req.headers['payment-signature']) { res.writeHead(200, { 'content-type': 'application/json' }); res.end('{"ok":true}'); return }
  res.writeHead(402, { 'payment-required': required, 'content-type': 'application/json' }); res.end('{}')
})
await new Promise<void>((r) => merchant.listen(0, '127.0.0.1', r))
const murl = `http://127.0.0.1:${(merchant.address() as AddressInfo).port}`
required = Buffer.from(JSON.stringify({ x402Version: 2, error: 'x', resource: { url: `${murl}/paid` }, accepts: [{ scheme: 'exact', network: `eip155:${info.chainId}`, amount: '1', asset: info.token, payTo, maxTimeoutSeconds: 60, extra: { name: 'USD Coin', version: '2' } }] })).toString('base64')
await gw.api('POST', '/v1/agents', { body: { agentId: 'b' } })
await gw.api('POST', '/v1/wallets', { body: { agentId: 'b' } })
const pool = new Pool(gw.url, { connections: 4 })
const body = JSON.stringify({ agentId: 'b', endpoint: `${murl}/paid` })
const { Session } = await import('node:inspector/promises')
const session = new Session(); session.connect()
await session.post('Profiler.enable'); await session.post('Profiler.setSamplingInterval', { interval: 50 }); await session.post('Profiler.start')
const t: number[] = []
for (let i = 0; i < 4000; i++) {
  const s = performance.now()
  const r = await pool.request({ path: '/v1/pay', method: 'POST', headers: { authorization: `Bearer ${gw.accountKey}`, 'content-type': 'application/json' }, body })
  await r.body.dump()
  t.push(performance.now() - s)
}
const { profile } = await session.post('Profiler.stop')
;(await import('node:fs')).writeFileSync('/tmp/seq.cpuprofile', JSON.stringify(profile))
t.sort((a, b) => a - b); console.log('api p50', t[2000]!.toFixed(3))
merchant.close(); await pool.close(); await gw.close()
