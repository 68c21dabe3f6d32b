import t, { type Test } from 'tap'
import { execFile } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { rootCertificates } from 'node:tls'
import { promisify } from 'node:util'
import type { Hex } from 'viem'
import { testChain } from '../helpers/gateway.js'
import { interceptionTestbed } from '../helpers/tls-front.js'
import { startV1Merchant, startV2Merchant } from '../helpers/merchants.js'
import { runCli } from '../helpers/process.js'

/**
 * Real clients pay both merchants through the proxy, HTTPS intercepted: curl, Python
 * requests and Node (the README's recipe), each against the official `@x402/express` v2
 * merchant and the x402 v1 merchant, with balances moving on chain. Then the README's
 * bundle recipe as written: `paygate ca --bundle` from the CLI, and curl with
 * `CURL_CA_BUNDLE`, Python with `REQUESTS_CA_BUNDLE`, the proxy in `HTTPS_PROXY`.
 */
const run = promisify(execFile)
const { dir, gw, caFile, proxyPort, closers, httpsOf } = await interceptionTestbed(t)
const { balanceOf, merchantOptions } = await testChain(gw)

interface Shop {
  kind: 'v1' | 'v2'
  https: string
  payTo: Hex
}

async function merchant(kind: 'v1' | 'v2'): Promise<Shop> {
  const opts = await merchantOptions(5_000n)
  const m = kind === 'v2' ? await startV2Merchant(opts) : await startV1Merchant(opts)
  closers.push(() => m.close())
  return { kind, https: await httpsOf(m), payTo: opts.payTo }
}

const agentKey = (await gw.api('POST', '/v1/agents', { body: { agentId: 'cl' } })).body.apiKey as string
const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: 'cl' } })).body.address as Hex
const proxyUrl = `http://cl:${agentKey}@127.0.0.1:${proxyPort}`
const shops = [await merchant('v2'), await merchant('v1')]

/** The environment of a client process: this one's, minus any proxy or CA setting it carries, plus `extra`. */
function clientEnv(extra: Record<string, string>): Record<string, string> {
  const env: Record<string, string> = {}
  for (const [k, v] of Object.entries(process.env)) {
    if (v === undefined || /_proxy$|^(CURL_CA_BUNDLE|REQUESTS_CA_BUNDLE|SSL_CERT_FILE|SSL_CERT_DIR|NODE_EXTRA_CA_CERTS)$/i.test(k)) continue
    env[k] = v
  }
  return { ...env, NO_PROXY: '', no_proxy: '', ...extra }
}

/** The README's proxy variables. */
const proxyVars = { HTTPS_PROXY: proxyUrl, HTTP_PROXY: proxyUrl }

/** A python3 with requests: the first on PATH may be a separate install (pyenv); Debian's python3-requests serves /usr/bin/python3. */
async function python(t: Test): Promise<string> {
  for (const cand of ['python3', '/usr/bin/python3']) {
    if (
      await run(cand, ['-c', 'import requests']).then(
        () => true,
        () => false,
      )
    )
      return cand
  }
  t.fail('a python3 with requests (.ci/run installs python3-requests when none has it)')
  return 'python3'
}

/** What a client reports of one answer. */
interface Seen {
  status: number
  tx: string | null
  amount: string | null
  ok: unknown
}

/** curl's `-i` output as Seen: the target's answer, after the proxy's CONNECT answer that curl shows first. */
function fromCurl(out: string): Seen {
  const connect = /^HTTP\/1\.1 200 Connection Established\r\n(?:[^\r\n]*\r\n)*?\r\n/i.exec(out)
  const stdout = connect ? out.slice(connect[0].length) : out
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(stdout)?.[1] ?? 0)
  const header = (name: string): string | null => new RegExp(`^${name}: (.*?)\\r?$`, 'im').exec(stdout)?.[1] ?? null
  const body = stdout.slice(stdout.indexOf('\r\n\r\n') + 4)
  let ok: unknown
  try {
    ok = JSON.parse(body).ok
  } catch {
    ok = undefined
  }
  return { status, tx: header('x-paygate-tx'), amount: header('x-paygate-amount'), ok }
}

const PY_PAY = `import json, requests, sys
r = requests.get(sys.argv[1], timeout=20)
print(json.dumps({'status': r.status_code, 'tx': r.headers.get('X-Paygate-Tx'), 'amount': r.headers.get('X-Paygate-Amount'), 'ok': r.json().get('ok')}))`

/** One paid call through `pay`: the client saw the target's answer with Paygate's headers, and 0.005 USDC moved on chain. */
async function paysOnChain(t: Test, client: string, shop: Shop, pay: (url: string) => Promise<Seen>): Promise<void> {
  const label = `${client} → ${shop.kind}`
  const [merchantBefore, walletBefore] = [await balanceOf(shop.payTo), await balanceOf(wallet)]
  const seen = await pay(`${shop.https}/paid`)
  t.equal(seen.status, 200, `${label}: 200`)
  t.match(seen.tx, /^0x[0-9a-f]{64}$/, `${label}: X-Paygate-Tx`)
  t.equal(seen.amount, '0.005', `${label}: X-Paygate-Amount`)
  t.equal(seen.ok, true, `${label}: the merchant's own body`)
  t.equal(await balanceOf(shop.payTo), merchantBefore + 5_000n, `${label}: the merchant was paid on chain`)
  t.equal(await balanceOf(wallet), walletBefore - 5_000n, `${label}: from the agent's wallet`)
}

t.test('curl (-x, --cacert) pays the v2 and the v1 merchant', async (t) => {
  for (const shop of shops) {
    await paysOnChain(t, 'curl', shop, async (url) => fromCurl((await run('curl', ['-s', '-i', '--max-time', '20', '--cacert', caFile, '-x', proxyUrl, url], { env: clientEnv({}) })).stdout))
  }
})

t.test('Python requests (HTTPS_PROXY, REQUESTS_CA_BUNDLE) pays the v2 and the v1 merchant', async (t) => {
  const py = await python(t)
  for (const shop of shops) {
    await paysOnChain(t, 'python', shop, async (url) => JSON.parse((await run(py, ['-c', PY_PAY, url], { env: clientEnv({ ...proxyVars, REQUESTS_CA_BUNDLE: caFile }) })).stdout))
  }
})

t.test('Node recipe (NODE_EXTRA_CA_CERTS, undici EnvHttpProxyAgent) pays the v2 and the v1 merchant', async (t) => {
  const script = `
    const { EnvHttpProxyAgent, setGlobalDispatcher } = require('undici')
    setGlobalDispatcher(new EnvHttpProxyAgent())
    fetch(process.argv[1]).then(async (r) => console.log(JSON.stringify({ status: r.status, tx: r.headers.get('x-paygate-tx'), amount: r.headers.get('x-paygate-amount'), ok: (await r.json()).ok })))
  `
  for (const shop of shops) {
    await paysOnChain(t, 'node', shop, async (url) =>
      JSON.parse((await run(process.execPath, ['-e', script, url], { env: clientEnv({ ...proxyVars, NODE_EXTRA_CA_CERTS: caFile }), cwd: process.cwd() })).stdout),
    )
  }
})

t.test('README bundle recipe: `paygate ca --bundle`, then curl with CURL_CA_BUNDLE and Python with REQUESTS_CA_BUNDLE', async (t) => {
  // `npm start -- ca --bundle > paygate-bundle.pem`: npm start runs the entry, src/main.ts, on the gateway's certs.
  const cli = await runCli({ PAYGATE_DATA_DIR: gw.dataDir }, ['ca', '--bundle'])
  t.equal(cli.code, 0, cli.stderr)
  const bundle = join(dir, 'paygate-bundle.pem')
  writeFileSync(bundle, cli.stdout)
  t.ok(cli.stdout.includes(gw.gw.ca.certPem.trim()), 'the bundle holds the running gateway’s CA')
  t.equal(cli.stdout.match(/-----BEGIN CERTIFICATE-----/g)?.length, rootCertificates.length + 1, 'and the system roots')
  // The same roots without Paygate's CA: the clients refuse the intercepted certificate, so the variables are what they trust.
  const rootsOnly = join(dir, 'roots-only.pem')
  writeFileSync(rootsOnly, `${rootCertificates.join('\n')}\n`)

  const curl = (caBundle: string, url: string) => run('curl', ['-s', '-i', '--max-time', '20', url], { env: clientEnv({ ...proxyVars, CURL_CA_BUNDLE: caBundle }) })
  const refused = await curl(rootsOnly, `${shops[0]!.https}/free`).then(
    () => 0,
    (e: { code: number }) => e.code,
  )
  t.equal(refused, 60, 'curl without the bundle: the certificate is not trusted (exit 60)')
  for (const shop of shops) await paysOnChain(t, 'curl CURL_CA_BUNDLE', shop, async (url) => fromCurl((await curl(bundle, url)).stdout))

  const py = await python(t)
  const pyRun = (caBundle: string, url: string) => run(py, ['-c', PY_PAY, url], { env: clientEnv({ ...proxyVars, REQUESTS_CA_BUNDLE: caBundle }) })
  const pyRefused = await pyRun(rootsOnly, `${shops[0]!.https}/free`).then(
    () => '',
    (e: { stderr: string }) => e.stderr,
  )
  t.match(pyRefused, /SSLError|CERTIFICATE_VERIFY_FAILED/, 'Python without the bundle: the certificate is not trusted')
  for (const shop of shops) await paysOnChain(t, 'python REQUESTS_CA_BUNDLE', shop, async (url) => JSON.parse((await pyRun(bundle, url)).stdout))
})
