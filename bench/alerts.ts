/**
 * Paid-call latency while every notification goes to a receiver that never answers, as a
 * ratio against the same calls with no alerts at all, in one run: payments must never wait
 * on a delivery. Phase A: no alerts. Phase B: the paying agent has alerts (spend_rate,
 * budget_pct, policy_violation) and an account endpoint, all pointing at a receiver that
 * holds every request open, while another agent's stream of refusals (bounded) keeps the
 * delivery queue full (`notify.concurrency` attempts hanging, the rest on disk).
 */
import { readFileSync, rmSync } from 'node:fs'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { Pool } from 'undici'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { tempDir } from '../test/helpers/gateway.js'
import { call, spawnGateway } from '../test/helpers/process.js'
import { fmt, spawnServer, timeAlternating } from './lib.js'

export async function benchAlerts(opts: { calls: number; maxMs: number; refusals: number }): Promise<void> {
  const receiver = await startReceiver()
  const s = await setUp()
  report(await measure(s, receiver.url, opts), receiver.received())
  await s.pool.close()
  s.merchant.kill('SIGTERM')
  await s.gw.stop('SIGKILL')
  await receiver.close()
  rmSync(s.dataDir, { recursive: true, force: true })
}

type Setup = Awaited<ReturnType<typeof setUp>>

/** The receiver that never answers: every request it gets is counted and held open. */
async function startReceiver() {
  const held: ServerResponse[] = []
  let received = 0
  const hang = createServer((req, res) => {
    received++
    req.resume()
    held.push(res)
  })
  await new Promise<void>((r) => hang.listen(0, '127.0.0.1', r))
  const hangUrl = `http://127.0.0.1:${(hang.address() as AddressInfo).port}`
  return {
    url: hangUrl,
    received: (): number => received,
    close: async (): Promise<void> => {
      for (const r of held) r.destroy()
      await new Promise<void>((r) => hang.close(() => r()))
    },
  }
}

/** The gateway and the merchant, each in its own process, the paying agent and the refused one (its policy blocks the merchant), and the call they make. */
async function setUp() {
  const dataDir = tempDir('paygate-bench-')
  const lift = {
    PAYGATE_API_RATE_LIMIT_PER_MINUTE: '10000000',
    PAYGATE_API_RATE_LIMIT_BURST: '10000000',
    PAYGATE_API_RATE_LIMIT_PER_KEY_PER_MINUTE: '10000000',
    PAYGATE_API_RATE_LIMIT_PER_KEY_BURST: '10000000',
  }
  const gw = await spawnGateway({ PAYGATE_DATA_DIR: dataDir, PAYGATE_NOTIFY_ENDPOINT_PER_MINUTE: '100000', ...lift }, [], [], false)
  const key = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const info = (await call(gw.url, 'GET', '/v1/chain', key)).body
  const { proc: merchant, url: murl } = await spawnServer('./x402-merchant.ts', {
    BENCH_CHAIN_ID: String(info.chainId),
    BENCH_TOKEN: info.token,
    BENCH_PAY_TO: privateKeyToAccount(generatePrivateKey()).address,
  })
  for (const a of ['payer', 'refused']) {
    await call(gw.url, 'POST', '/v1/agents', key, { agentId: a })
    await call(gw.url, 'POST', '/v1/wallets', key, { agentId: a })
  }
  await call(gw.url, 'PUT', '/v1/policies/refused', key, { blockedDomains: ['127.0.0.1'] })

  const pool = new Pool(gw.url, { connections: 8 })
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' }
  const payAs = async (agentId: string, want: number): Promise<void> => {
    const r = await pool.request({ path: '/v1/pay', method: 'POST', headers, body: JSON.stringify({ agentId, endpoint: `${murl}/paid`, method: 'GET' }) })
    await r.body.dump()
    if (r.statusCode !== want) throw new Error(`pay as ${agentId}: ${r.statusCode}`)
  }
  return { dataDir, gw, key, merchant, pool, payAs }
}

interface Figures {
  quiet: { n: number; p50: number; p99: number }
  quietRefusals: number
  loud: { n: number; p50: number; p99: number }
  loudRefusals: number
  /** Deliveries pending at the end, counted up to 500. */
  deliveries: number
}

/** Warm up, then phase A (no alerts) and phase B (every alert and the account endpoint pointing at the receiver). */
async function measure(s: Setup, hangUrl: string, opts: { calls: number; maxMs: number; refusals: number }): Promise<Figures> {
  const paid = (): Promise<void> => s.payAs('payer', 200)
  const nothing = async (): Promise<void> => {}

  // Both phases run the same bounded stream of refusals beside the paid calls (another agent,
  // blocked by its policy): only the alerts differ, so the ratio is what notifications cost.
  const measured = async (): Promise<[{ n: number; p50: number; p99: number }, number]> => {
    let stop = false
    let n = 0
    const storm = (async () => {
      while (!stop && n < opts.refusals) {
        await s.payAs('refused', 402)
        n++
      }
    })()
    const [, lat] = await timeAlternating(opts.calls, opts.maxMs, nothing, paid)
    stop = true
    await storm
    return [lat, n]
  }
  await timeAlternating(300, opts.maxMs, nothing, paid)
  const [quiet, quietRefusals] = await measured()

  await pointAlertsAt(s, hangUrl)
  const [loud, loudRefusals] = await measured()
  const deliveries = (await call(s.gw.url, 'GET', '/v1/deliveries?status=pending&limit=500', s.key)).body.deliveries.length
  return { quiet, quietRefusals, loud, loudRefusals, deliveries }
}

/** The account endpoint and every alert (spend_rate and budget_pct on the payer, policy_violation on the refused agent) notify the receiver at `hangUrl`. */
async function pointAlertsAt(s: Setup, hangUrl: string): Promise<void> {
  const { gw, key } = s
  const hook = { type: 'webhook', url: `${hangUrl}/hook` }
  await call(gw.url, 'POST', '/v1/webhooks', key, { url: `${hangUrl}/account` })
  await call(gw.url, 'PUT', '/v1/policies/payer', key, { dailyBudget: { usdc: 1_000_000 } })
  await call(gw.url, 'POST', '/v1/alerts', key, { agentId: 'payer', type: 'spend_rate', threshold: 0.000001, window: '1m', notify: hook })
  await call(gw.url, 'POST', '/v1/alerts', key, { agentId: 'payer', type: 'budget_pct', threshold: 1, notify: hook })
  await call(gw.url, 'POST', '/v1/alerts', key, { agentId: 'refused', type: 'policy_violation', notify: hook })
}

function report(x: Figures, received: number): void {
  const { quiet, quietRefusals, loud, loudRefusals, deliveries } = x
  console.log('\n== paid POST /v1/pay with every notification going to a receiver that never answers, vs no alerts ==')
  console.log(`no alerts: paid p50 ${fmt(quiet.p50, 3)} ms p99 ${fmt(quiet.p99, 3)} ms (n=${quiet.n}; ${quietRefusals} refusals alongside)`)
  console.log(
    `hanging receiver: paid p50 ${fmt(loud.p50, 3)} ms p99 ${fmt(loud.p99, 3)} ms (n=${loud.n}; ${loudRefusals} refusals alongside, each a delivery); ` +
      `${received} requests held open, ${deliveries}${deliveries === 500 ? '+' : ''} deliveries pending`,
  )
  console.log(`ratio hanging/none: p50 ${fmt(loud.p50 / quiet.p50)}x, p99 ${fmt(loud.p99 / quiet.p99)}x`)
}
