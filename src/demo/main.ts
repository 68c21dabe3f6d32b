/**
 * `npm run demo`: a paid request end to end on the embedded chain. It finds the running
 * gateway (or starts one in a temporary directory), starts a demo merchant on loopback that
 * settles for real, sets up `demo-agent` (policy allowing 127.0.0.1, wallet, agent key), pays
 * once through `POST /v1/pay` and once through the proxy (curl, or Node when curl is
 * missing), prints what happened and commands to try, and keeps running until Ctrl-C.
 */
import { execFile } from 'node:child_process'
import { chmodSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { ProxyAgent, request } from 'undici'
import { loadConfig } from '../config/load.js'
import { PaygateError, isPaygateError } from '../errors/index.js'
import { scrubSecrets } from '../log/index.js'
import { startDemoMerchant, type DemoMerchant } from './merchant.js'
import { api, demoTarget, refuseExternal, type DemoTarget } from './target.js'
import { commands, DASHBOARD_PATH, paidLine, type Paid, type TxShown } from './report.js'

const AGENT = 'demo-agent'
const PRICE = '0.01'
const run = promisify(execFile)
const say = (line = ''): boolean => process.stdout.write(`${line}\n`)

/** The demo agent: its policy (creating it), its wallet, funds for the demo, and a fresh agent key in a 0600 file. */
async function setUpAgent(t: DemoTarget): Promise<{ key: string; keyFile: string }> {
  const policy = await api(t, 'PUT', `/v1/policies/${AGENT}`, { allowedDomains: ['127.0.0.1'], dailyBudget: { usdc: 5 }, perCallLimit: { usdc: 0.05 } })
  if (policy.status !== 200) throw new PaygateError('internal_error', `setting the demo policy failed: ${JSON.stringify(policy.body)}`)
  const wallet = await api(t, 'POST', '/v1/wallets', { agentId: AGENT })
  if (wallet.status !== 201 && wallet.status !== 409) throw new PaygateError('internal_error', `creating the demo wallet failed: ${JSON.stringify(wallet.body)}`)
  const { balance } = (await api(t, 'GET', `/v1/wallets/${AGENT}`)).body
  if (balance.usdc < 1) await api(t, 'POST', `/v1/wallets/${AGENT}/faucet`, { usdc: 10 })
  const issued = await api(t, 'POST', `/v1/agents/${AGENT}/keys`)
  const keyFile = join(t.dataDir, `${AGENT}.key`)
  writeFileSync(keyFile, `${issued.body.apiKey}\n`, { mode: 0o600 })
  chmodSync(keyFile, 0o600)
  return { key: issued.body.apiKey, keyFile }
}

/** One GET through the proxy as an unmodified client does it: curl, or Node's undici when there is no curl. */
async function throughProxy(t: DemoTarget, key: string, url: string): Promise<{ tool: string; status: number; txHash: string | null; body: string }> {
  const proxy = new URL(t.proxyUrl)
  proxy.username = AGENT
  proxy.password = key
  try {
    const { stdout } = await run('curl', ['-sS', '-i', '--max-time', '60', '-x', proxy.href, url], { env: { PATH: process.env.PATH ?? '' } })
    const [head = '', body = ''] = stdout.split(/\r?\n\r?\n/)
    const tx = /^x-paygate-tx:\s*(\S+)/im.exec(head)
    return { tool: 'curl', status: Number(/^HTTP\/[\d.]+ (\d+)/.exec(head)?.[1] ?? 0), txHash: tx?.[1] ?? null, body }
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e
  }
  const agent = new ProxyAgent({ uri: t.proxyUrl, token: `Basic ${Buffer.from(`${AGENT}:${key}`).toString('base64')}` })
  try {
    const r = await request(url, { dispatcher: agent })
    const tx = r.headers['x-paygate-tx']
    return { tool: 'node', status: r.statusCode, txHash: typeof tx === 'string' ? tx : null, body: await r.body.text() }
  } finally {
    await agent.close()
  }
}

/** The transaction by its ledger hash, once its on-chain ledger record is confirmed (or after 30 s, as it stands). */
async function confirmed(t: DemoTarget, txHash: string): Promise<TxShown> {
  const until = Date.now() + 30_000
  for (;;) {
    const tx = (await api(t, 'GET', `/v1/transactions/${txHash}`)).body
    if (tx?.ledger?.status === 'confirmed' || Date.now() > until) return tx
    await new Promise((r) => setTimeout(r, 250))
  }
}

async function payTwice(t: DemoTarget, m: DemoMerchant, key: string): Promise<Paid[]> {
  const out: Paid[] = []
  const viaApi = await api(t, 'POST', '/v1/pay', { agentId: AGENT, endpoint: `${m.url}/paid`, method: 'GET' })
  if (viaApi.status !== 200 || !viaApi.body.txHash) throw new PaygateError('internal_error', `POST /v1/pay did not pay: ${viaApi.status} ${JSON.stringify(viaApi.body)}`)
  out.push({ how: 'POST /v1/pay', url: `${m.url}/paid`, tx: await confirmed(t, viaApi.body.txHash), answer: JSON.stringify(viaApi.body.data) })
  const proxied = await throughProxy(t, key, `${m.url}/mpp`)
  if (proxied.status !== 200 || !proxied.txHash) throw new PaygateError('internal_error', `the proxied request did not pay: ${proxied.status} ${proxied.body}`)
  out.push({ how: `the proxy (${proxied.tool})`, url: `${m.url}/mpp`, tx: await confirmed(t, proxied.txHash), answer: proxied.body.trim() })
  return out
}

async function main(): Promise<void> {
  const { config } = loadConfig({ argv: process.argv.slice(2), env: process.env })
  const t = await demoTarget(config)
  let merchant: DemoMerchant | undefined
  const stop = async (code: number): Promise<never> => {
    await merchant?.close()
    await t.close()
    process.exit(code)
  }
  // npm forwards the signal a terminal sends to the whole group: a second one must not cut the stop short.
  let stopping = false
  const onSignal = (): void => {
    if (stopping) return
    stopping = true
    void stop(0)
  }
  process.on('SIGINT', onSignal)
  process.on('SIGTERM', onSignal)
  try {
    say(t.started ? `Started a gateway in ${t.dataDir} (removed on exit): API ${t.apiUrl}, proxy ${t.proxyUrl}` : `Using the gateway at ${t.apiUrl} (proxy ${t.proxyUrl})`)
    const chain = (await api(t, 'GET', '/v1/chain')).body
    refuseExternal(chain)
    merchant = await startDemoMerchant({ rpcUrl: chain.rpcUrl, chainId: chain.chainId, network: chain.network, token: chain.token }, PRICE)
    say(`Demo merchant: ${merchant.url} (GET /paid offers x402 v2 and MPP, GET /mpp only MPP; ${PRICE} USDC a call, settled on ${chain.network})`)
    const { key, keyFile } = await setUpAgent(t)
    const before = (await api(t, 'GET', `/v1/wallets/${AGENT}`)).body
    say(`Agent ${AGENT}: wallet ${before.address}, balance ${before.balance.usdc} USDC`)
    say()
    const paid = await payTwice(t, merchant, key)
    for (const p of paid) for (const line of paidLine(p)) say(line)
    const after = (await api(t, 'GET', `/v1/wallets/${AGENT}`)).body
    say(`Balance: ${before.balance.usdc} USDC before, ${after.balance.usdc} USDC after`)
    say()
    // The gateway may run with api.dashboard false: its / then answers 404.
    const dashboard = await fetch(`${t.apiUrl}${DASHBOARD_PATH}`, { redirect: 'manual' }).then(
      (r) => {
        void r.body?.cancel()
        return r.status !== 404
      },
      () => false,
    )
    for (const line of commands({ t, merchantUrl: merchant.url, agent: AGENT, keyFile, dashboard })) say(line)
    say()
    say('The demo merchant keeps running (and the gateway, if the demo started it). Press Ctrl-C to stop.')
  } catch (e) {
    process.stderr.write(`paygate demo: ${scrubSecrets(isPaygateError(e) ? e.detail : e instanceof Error ? e.message : String(e))}\n`)
    await stop(isPaygateError(e) && e.code === 'invalid_config' ? 2 : 1)
  }
}

await main()
