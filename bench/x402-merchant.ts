/**
 * The pay benchmark's merchant, run as its own process (as a real merchant would be): a
 * minimal x402 v2 server answering 402 with PAYMENT-REQUIRED, and 200 when a
 * PAYMENT-SIGNATURE decodes, with a PAYMENT-RESPONSE that reports a settlement it never makes
 * (the benchmark measures the gateway; a real merchant settles first). Env: BENCH_CHAIN_ID, BENCH_TOKEN, BENCH_PAY_TO. Prints
 * `{"url": ...}` once listening on 127.0.0.1.
 */
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'

const { BENCH_CHAIN_ID, BENCH_TOKEN, BENCH_PAY_TO } = process.env
let required = ''
const settled = Buffer.from(JSON.stringify({ success: true, transaction: `0x${'00'.repeat(32)}`, network: `eip155:${BENCH_CHAIN_ID}`, payer: null })).toString('base64')
const server = createServer((req, res) => {
  const sig = req.headers['payment-signature']
  if (typeof sig === 'string') {
    JSON.parse(Buffer.from(sig, 'base64').toString())
    res.writeHead(200, { 'content-type': 'application/json', 'payment-response': settled })
    res.end('{"ok":true}')
    return
  }
  res.writeHead(402, { 'payment-required': required, 'content-type': 'application/json' })
  res.end('{}')
})
server.keepAliveTimeout = 60_000
server.listen(0, '127.0.0.1', () => {
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const accepts = [{ scheme: 'exact', network: `eip155:${BENCH_CHAIN_ID}`, amount: '1', asset: BENCH_TOKEN, payTo: BENCH_PAY_TO, maxTimeoutSeconds: 60, extra: { name: 'USD Coin', version: '2' } }]
  required = Buffer.from(JSON.stringify({ x402Version: 2, error: 'payment required', resource: { url: `${url}/paid`, description: 'bench', mimeType: 'application/json' }, accepts })).toString(
    'base64',
  )
  process.stdout.write(`${JSON.stringify({ url })}\n`)
})
process.on('SIGTERM', () => server.close(() => process.exit(0)))
