import t from 'tap'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { testChain } from '../helpers/gateway.js'
import { interceptionTestbed } from '../helpers/tls-front.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * An HTTP/1.0 client inside an intercepted tunnel: curl --http1.0 offers ALPN `http/1.0`
 * only, and the proxy's TLS server, which offered `http/1.1` alone, refused the handshake
 * ("no application protocol") although docs/proxy.md serves HTTP/1.0 (plain HTTP did).
 */
const run = promisify(execFile)
const { gw, caFile, proxyPort, closers, httpsOf } = await interceptionTestbed(t)
const { merchantOptions } = await testChain(gw)
const m = await startV2Merchant(await merchantOptions(5_000n))
closers.push(() => m.close())
const https = await httpsOf(m)
const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'h10' } })).body.apiKey as string
await gw.api('POST', '/v1/wallets', { body: { agentId: 'h10' } })
const proxyUrl = `http://h10:${key}@127.0.0.1:${proxyPort}`
const env = { PATH: process.env.PATH ?? '/usr/bin:/bin' }

const curl = async (version: string, url: string): Promise<string> => {
  const r = await run('curl', ['-s', '-i', '--max-time', '20', version, '--cacert', caFile, '-x', proxyUrl, url], { env }).catch((e: { code: number; stdout: string }) => ({
    stdout: `curl exit ${e.code}\n${e.stdout}`,
  }))
  return r.stdout
}

t.test('curl --http1.0 over HTTPS: a free answer and a paid one', async (t) => {
  const free = await curl('--http1.0', `${https}/free`)
  t.match(free, /^HTTP\/1\.1 200 Connection Established\r\n\r\nHTTP\/1\.[01] 200 /, 'the target answered through the tunnel')
  t.match(free, /"free":true/)
  const paid = await curl('--http1.0', `${https}/paid`)
  t.match(paid, /\r\nHTTP\/1\.[01] 200 /, 'the paid answer')
  t.match(paid, /\r\nx-paygate-tx: 0x[0-9a-f]{64}\r\n/i)
  t.match(paid, /"paid":"v2"/)
  t.equal(m.stats.settlements, 1)
})

t.test('curl --http1.1 still negotiates http/1.1', async (t) => {
  const free = await curl('--http1.1', `${https}/free`)
  t.match(free, /\r\nHTTP\/1\.1 200 /, 'http/1.1 still')
})
