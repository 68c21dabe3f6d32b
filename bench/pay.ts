/**
 * Paid POST /v1/pay against a local x402 v2 merchant, in the same run as its floor: two
 * plain round trips to the merchant (a paid call is a 402 then a paid retry). Everything
 * durable: LevelDB records, ledger outbox, the embedded chain.
 */
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { rmSync } from 'node:fs'
import { Pool } from 'undici'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { startTestGateway, tempDir } from '../test/helpers/gateway.js'
import { fmt, throughput, timeSequential } from './lib.js'

export async function benchPay(opts: { sequential: number; concurrent: number; maxMs: number }): Promise<void> {
  const dataDir = tempDir('paygate-bench-')
  const gw = await startTestGateway({ dataDir, env: { PAYGATE_LOG_LEVEL: 'warn', PAYGATE_API_RATE_LIMIT_PER_MINUTE: '10000000', PAYGATE_API_RATE_LIMIT_BURST: '10000000' } })
  const info = (await gw.api('GET', '/v1/chain')).body
  const payTo = privateKeyToAccount(generatePrivateKey()).address

  // A minimal v2 merchant: 402 with PAYMENT-REQUIRED, 200 when PAYMENT-SIGNATURE decodes.
  let required = ''
  const requirement = (url: string): string => Buffer.from(
    JSON.stringify({
      x402Version: 2,
      error: 'payment required',
      resource: { url, description: 'bench', mimeType: 'application/json' },
      accepts: [{ scheme: 'exact', network: `eip155:${info.chainId}`, amount: '1', asset: info.token, payTo, maxTimeoutSeconds: 60, extra: { name: 'USD Coin', version: '2' } }],
    }),
  ).toString('base64')
  const merchant = createServer((req, res) => {
    const sig = req.headers['payment-signature']
    if (typeof sig === 'string') {
      JSON.parse(Buffer.from(sig, 'base64').toString())
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"ok":true}')
      return
    }
    res.writeHead(402, { 'payment-required': required, 'content-type': 'application/json' })
    res.end('{}')
  })
  merchant.keepAliveTimeout = 60_000
  await new Promise<void>((r) => merchant.listen(0, '127.0.0.1', r))
  const murl = `http://127.0.0.1:${(merchant.address() as AddressInfo).port}`
  required = requirement(`${murl}/paid`)

  const CALLERS = 16
  for (let i = 0; i < CALLERS; i++) {
    await gw.api('POST', '/v1/agents', { body: { agentId: `bench${i}` } })
    await gw.api('POST', '/v1/wallets', { body: { agentId: `bench${i}` } })
  }

  const mpool = new Pool(murl, { connections: 32 })
  const apool = new Pool(gw.url, { connections: 32 })
  const plain = async (): Promise<void> => {
    const r = await mpool.request({ path: '/paid', method: 'GET' })
    await r.body.dump()
  }
  const floor = async (): Promise<void> => {
    await plain()
    await plain()
  }
  const payBody = (agent: number): string => JSON.stringify({ agentId: `bench${agent}`, endpoint: `${murl}/paid`, method: 'GET' })
  const headers = { authorization: `Bearer ${gw.accountKey}`, 'content-type': 'application/json' }
  const paidAs = async (agent: number): Promise<void> => {
    const r = await apool.request({ path: '/v1/pay', method: 'POST', headers, body: payBody(agent) })
    const text = await r.body.text()
    if (r.statusCode !== 200 || !text.includes('"txHash":"0x')) throw new Error(`pay failed: ${r.statusCode} ${text}`)
  }

  const paid = (): Promise<void> => paidAs(0)
  let next = 0
  const paidManyAgents = (): Promise<void> => paidAs(next++ % CALLERS)

  // Warm up both paths.
  await timeSequential(200, 5_000, floor)
  await timeSequential(200, 10_000, paid)

  const f = await timeSequential(opts.sequential, opts.maxMs, floor)
  const p = await timeSequential(opts.sequential, opts.maxMs, paid)
  const ft = await throughput(16, opts.concurrent, opts.maxMs, floor)
  const pt = await throughput(16, opts.concurrent, opts.maxMs, paid)
  const pm = await throughput(16, opts.concurrent, opts.maxMs, paidManyAgents)
  const drainStart = Date.now()
  const drained = await gw.gw.outbox.drain(120_000)
  const drainMs = Date.now() - drainStart

  console.log('\n== paid POST /v1/pay vs floor (two plain round trips to the same merchant) ==')
  console.log(`sequential: floor p50 ${fmt(f.p50, 3)} ms p99 ${fmt(f.p99, 3)} ms (n=${f.n}); paid p50 ${fmt(p.p50, 3)} ms p99 ${fmt(p.p99, 3)} ms (n=${p.n})`)
  console.log(`ratio paid/floor: p50 ${fmt(p.p50 / f.p50)}x (+${fmt(p.p50 - f.p50, 3)} ms), p99 ${fmt(p.p99 / f.p99)}x (+${fmt(p.p99 - f.p99, 3)} ms)`)
  console.log(`16 callers: floor ${fmt(ft.perSec, 0)} pairs/s (n=${ft.n})`)
  console.log(`  one agent: ${fmt(pt.perSec, 0)} paid/s (n=${pt.n}); ratio to floor ${fmt(pt.perSec / ft.perSec)}x`)
  console.log(`  16 agents: ${fmt(pm.perSec, 0)} paid/s (n=${pm.n}); ratio to floor ${fmt(pm.perSec / ft.perSec)}x`)
  console.log(`ledger outbox: every record confirmed on chain: ${drained} (${drainMs} ms after the last payment)`)

  await apool.close()
  await mpool.close()
  await new Promise<void>((r) => merchant.close(() => r()))
  await gw.close()
  rmSync(dataDir, { recursive: true, force: true })
}
