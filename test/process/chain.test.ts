import t from 'tap'
import { readFileSync, rmSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { createWalletClient, http } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { startDevnet } from '../../src/chain/devnet/index.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { viemChain } from '../../src/chain/chain.js'
import { alive, freeze } from '../helpers/freeze.js'
import { tempDir, testDir } from '../helpers/gateway.js'
import { call, runCli, spawnGateway, type GatewayProcess } from '../helpers/process.js'

const logsOf = (g: GatewayProcess) => g.stdout.map((l) => JSON.parse(l) as Record<string, any>)
const anvilPidOf = (g: GatewayProcess): number => logsOf(g).find((j) => j.msg === 'anvil started')!.pid as number
const parentOf = (pid: number): number => Number(readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')[1])
async function goneWithin(pids: number[], ms: number): Promise<boolean> {
  const end = Date.now() + ms
  while (Date.now() < end) {
    if (pids.every((p) => !alive(p))) return true
    await new Promise((r) => setTimeout(r, 50))
  }
  return false
}

t.test('contracts deployed once; balances and acknowledged changes survive SIGTERM and SIGKILL; no child outlives Paygate', async (t) => {
  const dataDir = testDir(t)
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const chain1 = (await call(first.url, 'GET', '/v1/chain', acct)).body
  t.ok(logsOf(first).some((j) => j.msg === 'deployed token and ledger on the embedded chain'))
  await call(first.url, 'POST', '/v1/agents', acct, { agentId: 'w1' })
  const w1 = (await call(first.url, 'POST', '/v1/wallets', acct, { agentId: 'w1' })).body
  await call(first.url, 'POST', '/v1/wallets/w1/faucet', acct, { usdc: 1.5 })

  const anvil1 = anvilPidOf(first)
  const watchdog1 = parentOf(anvil1)
  t.equal(await first.stop('SIGTERM'), 0)
  t.ok(await goneWithin([anvil1, watchdog1], 5000), 'anvil and its watchdog are gone after SIGTERM')

  const second = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  const chain2 = (await call(second.url, 'GET', '/v1/chain', acct)).body
  t.same([chain2.token, chain2.ledger], [chain1.token, chain1.ledger], 'the same contracts are reused')
  t.notOk(
    logsOf(second).some((j) => j.msg === 'deployed token and ledger on the embedded chain'),
    'no second deployment',
  )
  t.ok(chain2.blockNumber >= chain1.blockNumber, 'history kept')
  t.same((await call(second.url, 'GET', '/v1/wallets/w1', acct)).body, { address: w1.address, network: 'paygate-devnet', balance: { usdc: 1001.5 } })

  // Acknowledged changes right before a SIGKILL.
  await call(second.url, 'POST', '/v1/agents', acct, { agentId: 'w2' })
  const w2 = (await call(second.url, 'POST', '/v1/wallets', acct, { agentId: 'w2' })).body
  for (let i = 0; i < 5; i++) t.equal((await call(second.url, 'POST', '/v1/wallets/w2/faucet', acct, { usdc: 1 })).status, 200)
  const anvil2 = anvilPidOf(second)
  const watchdog2 = parentOf(anvil2)
  t.equal(await second.stop('SIGKILL'), 'SIGKILL')
  t.ok(await goneWithin([anvil2, watchdog2], 5000), 'anvil and its watchdog are gone after SIGKILL of Paygate')

  const started = Date.now()
  const third = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => third.stop('SIGKILL'))
  t.ok(Date.now() - started < 15_000, `restart after SIGKILL took ${Date.now() - started} ms`)
  t.same((await call(third.url, 'GET', '/v1/wallets/w2', acct)).body, { address: w2.address, network: 'paygate-devnet', balance: { usdc: 1005 } }, 'every acknowledged top-up is there')
  t.equal((await call(third.url, 'GET', '/v1/wallets/w1', acct)).body.balance.usdc, 1001.5)
  t.equal((await call(third.url, 'GET', '/v1/chain', acct)).body.token, chain1.token)
})

t.test('a wrong master key refuses to start', async (t) => {
  const dataDir = testDir(t)
  const g = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  await call(g.url, 'POST', '/v1/agents', acct, { agentId: 'm' })
  await call(g.url, 'POST', '/v1/wallets', acct, { agentId: 'm' })
  t.equal(await g.stop(), 0)
  const wrong = await runCli({ PAYGATE_DATA_DIR: dataDir, PAYGATE_MASTER_KEY: 'ef'.repeat(32), PAYGATE_API_PORT: '0', PAYGATE_CHAIN_RPC_PORT: '0' }, [])
  t.equal(wrong.code, 2)
  t.match(wrong.stderr, /master key \(PAYGATE_MASTER_KEY\) cannot decrypt the wallet keys/)
  t.notMatch(wrong.stderr, /efef/, 'the key is not echoed')
  t.notMatch(wrong.stderr, /\n\s+at /, 'no stack trace')
  const right = readFileSync(join(dataDir, 'master-key'), 'utf8').trim()
  const ok = await spawnGateway({ PAYGATE_DATA_DIR: dataDir, PAYGATE_MASTER_KEY: right })
  t.equal((await call(ok.url, 'GET', '/v1/wallets/m', acct)).status, 200, 'the right key in config works')
  t.equal(await ok.stop(), 0)
})

t.test('external chain: deploy-ledger CLI, then Paygate on a chain it did not start', async (t) => {
  const chainDir = tempDir()
  const dataDir = tempDir()
  const ext = await startDevnet({ dataDir: chainDir, chainId: 31338, host: '127.0.0.1', port: 0 })
  t.teardown(async () => {
    await ext.close()
    rmSync(chainDir, { recursive: true, force: true })
    rmSync(dataDir, { recursive: true, force: true })
  })
  const signerKey = generatePrivateKey()
  const signer = privateKeyToAccount(signerKey)
  await ext.request({ method: 'anvil_setBalance', params: [signer.address, '0x56bc75e2d63100000'] })
  // Configured as a hosted provider's URL would be: credentials in the userinfo, the path and
  // the query (the chain here answers at any path). None of them may show in logs or errors.
  const SECRETS = ['rpcpassword1', 'PATHKEY42', 'QUERYKEY7']
  const origin = new URL(ext.rpcUrl).host
  const rpcUrl = `http://paygate:rpcpassword1@${origin}/v3/PATHKEY42?apikey=QUERYKEY7`
  const shown = `http://${origin}/[redacted]`
  const leaks = (text: string): string[] => SECRETS.filter((s) => text.includes(s))
  const base = { PAYGATE_DATA_DIR: dataDir, PAYGATE_CHAIN_RPC_URL: rpcUrl, PAYGATE_CHAIN_CHAIN_ID: '31338', PAYGATE_CHAIN_SIGNER_KEY: signerKey }

  const missing = await runCli({ ...base, PAYGATE_API_PORT: '0' }, [])
  t.equal(missing.code, 2)
  t.match(missing.stderr, /set chain\.token .* and chain\.ledger/)

  const dep = await runCli(base, ['deploy-ledger', '--with-token'])
  t.equal(dep.code, 0, dep.stderr)
  const addrs = JSON.parse(dep.stdout)
  t.match(addrs, { ledger: /^0x[0-9a-fA-F]{40}$/, token: /^0x[0-9a-fA-F]{40}$/, signer: signer.address, chainId: 31338 })

  const wrongId = await runCli({ ...base, PAYGATE_CHAIN_CHAIN_ID: '5', PAYGATE_CHAIN_TOKEN: addrs.token, PAYGATE_CHAIN_LEDGER: addrs.ledger, PAYGATE_API_PORT: '0' }, [])
  t.equal(wrongId.code, 2)
  t.match(wrongId.stderr, /chain\.chainId = 5 but the chain at .* reports 31338/)
  t.ok(wrongId.stderr.includes(shown), 'the error names the chain by its origin')
  t.same(leaks(missing.stderr + dep.stdout + dep.stderr + wrongId.stderr), [], 'no credential of the RPC URL in the CLI output')

  const g = await spawnGateway({ ...base, PAYGATE_CHAIN_TOKEN: addrs.token, PAYGATE_CHAIN_LEDGER: addrs.ledger, PAYGATE_CHAIN_NETWORK: 'test-mainnet' })
  t.teardown(() => g.stop('SIGKILL'))
  t.notOk(
    logsOf(g).some((j) => j.msg === 'anvil started'),
    'no embedded chain is started',
  )
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const info = (await call(g.url, 'GET', '/v1/chain', acct)).body
  t.match(info, { network: 'test-mainnet', chainId: 31338, rpcUrl: shown, token: addrs.token, ledger: addrs.ledger })
  await call(g.url, 'POST', '/v1/agents', acct, { agentId: 'x' })
  const w = await call(g.url, 'POST', '/v1/wallets', acct, { agentId: 'x' })
  t.same(w.body.network, 'test-mainnet')
  t.equal((await call(g.url, 'GET', '/v1/wallets/x', acct)).body.balance.usdc, 0, 'no faucet on an external chain')
  const f = await call(g.url, 'POST', '/v1/wallets/x/faucet', acct, {})
  t.same([f.status, f.body.error], [403, 'forbidden'])

  // Funds sent on the external chain show in the wallet balance.
  const chain = viemChain(31338, 'ext', ext.rpcUrl)
  const wc = createWalletClient({ chain, transport: http(ext.rpcUrl), account: signer })
  await wc.writeContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'mint', args: [w.body.address, 7_000_000n] })
  const end = Date.now() + 5000
  let bal = 0
  while (Date.now() < end && bal !== 7) {
    bal = (await call(g.url, 'GET', '/v1/wallets/x', acct)).body.balance.usdc
    if (bal !== 7) await new Promise((r) => setTimeout(r, 50))
  }
  t.equal(bal, 7)
  t.same((await call(g.url, 'GET', '/readyz', null)).body.checks, { store: true, chain: true })
  t.ok(
    logsOf(g).some((j) => j.msg === 'chain ready' && j.rpcUrl === shown),
    'the chain is logged by its origin',
  )

  // With the chain gone, viem's errors carry the URL (less its userinfo) into the logs: hidden there too.
  await ext.close()
  const down = await call(g.url, 'GET', '/v1/wallets/x', acct)
  t.same([down.status, down.body.error, down.body.detail], [503, 'unavailable', 'the chain is not answering; retry later'], 'a balance read with the chain down is 503, not an internal error')
  t.equal(down.headers['retry-after'], '2')
  t.same([(await call(g.url, 'GET', '/v1/chain', acct)).status, (await call(g.url, 'GET', '/readyz', null)).body.checks], [503, { store: true, chain: false }])
  // A payment whose funds check cannot read the wallet: 503, nothing signed or recorded.
  const merchant = createServer((_req, res) => {
    const accepts = [{ scheme: 'exact', network: 'eip155:31338', amount: '1000', asset: addrs.token, payTo: signer.address, maxTimeoutSeconds: 60, extra: { name: 'USD Coin', version: '2' } }]
    const required = { x402Version: 2, resource: { url: `http://127.0.0.1:${(merchant.address() as AddressInfo).port}/paid` }, accepts }
    res.writeHead(402, { 'payment-required': Buffer.from(JSON.stringify(required)).toString('base64') }).end('{}')
  })
  await new Promise<void>((r) => merchant.listen(0, '127.0.0.1', r))
  t.teardown(() => merchant.close())
  const endpoint = `http://127.0.0.1:${(merchant.address() as AddressInfo).port}/paid`
  const pay = await call(g.url, 'POST', '/v1/pay', acct, { agentId: 'x', endpoint, method: 'GET' })
  t.same([pay.status, pay.body.error], [503, 'unavailable'], 'a payment with the chain down is 503')
  t.same((await call(g.url, 'GET', '/v1/transactions?agentId=x', acct)).body.transactions, [], 'nothing recorded')
  const chainError = (l: string): boolean => l.includes(shown) && /"level":"(warn|error)"/.test(l)
  const until = Date.now() + 5000
  while (Date.now() < until && !g.stdout.some(chainError)) await new Promise((r) => setTimeout(r, 50))
  t.ok(g.stdout.some(chainError), 'the chain error is logged with the URL shown by its origin')
  t.same(leaks([...g.stdout, ...g.stderr].join('\n')), [], 'no credential of the RPC URL in the logs')
})

/** Time one API call. */
async function timed(url: string, method: string, path: string, key: string | null): Promise<{ ms: number; status: number; body: any }> {
  const t0 = Date.now()
  const r = await call(url, method, path, key)
  return { ms: Date.now() - t0, status: r.status, body: r.body }
}

t.test('embedded chain: /readyz answers promptly with anvil frozen; an anvil killed under Paygate is logged and fails calls at once', async (t) => {
  const dataDir = testDir(t)
  const g = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => g.stop('SIGKILL'))
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  await call(g.url, 'POST', '/v1/agents', acct, { agentId: 'k' })
  t.equal((await call(g.url, 'POST', '/v1/wallets', acct, { agentId: 'k' })).status, 201)
  const anvil = anvilPidOf(g)

  await freeze(anvil)
  const frozen = await timed(g.url, 'GET', '/readyz', null)
  process.kill(anvil, 'SIGCONT')
  t.same([frozen.status, frozen.body.checks], [503, { store: true, chain: false }], 'not ready while anvil does not answer')
  t.ok(frozen.ms < 2500, `/readyz answered in ${frozen.ms} ms`)
  t.equal((await call(g.url, 'GET', '/readyz', null)).status, 200, 'ready again')

  process.kill(anvil, 'SIGKILL')
  const end = Date.now() + 5000
  const exitLine = (): Record<string, any> | undefined => logsOf(g).find((j) => j.msg === 'anvil exited unexpectedly')
  while (Date.now() < end && !exitLine()) await new Promise((r) => setTimeout(r, 50))
  t.match(exitLine(), { signal: 'SIGKILL', level: 'error' }, 'logged as an error')
  const ready = await timed(g.url, 'GET', '/readyz', null)
  t.same([ready.status, ready.body.checks], [503, { store: true, chain: false }])
  t.ok(ready.ms < 1000, `/readyz answered in ${ready.ms} ms`)
  const wallet = await timed(g.url, 'GET', '/v1/wallets/k', acct)
  t.same([wallet.status, wallet.body?.error], [503, 'unavailable'], 'a balance read is 503 unavailable')
  t.ok(wallet.ms < 1000, `at once: ${wallet.ms} ms`)
  t.notOk(alive(anvil), 'anvil is gone')
  t.equal(await g.stop('SIGTERM'), 0, 'Paygate still shuts down cleanly')
})

t.test('external chain behind a proxy that stops answering: /readyz answers not-ready within 2 s', async (t) => {
  const chainDir = tempDir()
  const dataDir = tempDir()
  const ext = await startDevnet({ dataDir: chainDir, chainId: 31338, host: '127.0.0.1', port: 0 })
  // forwards to the chain until told to hang: then it accepts requests and never answers
  let hang = false
  const proxy = createServer((req, res) => {
    if (hang) return
    const chunks: Buffer[] = []
    req
      .on('data', (c: Buffer) => chunks.push(c))
      .on('end', async () => {
        const r = await fetch(ext.rpcUrl, { method: 'POST', headers: { 'content-type': 'application/json' }, body: Buffer.concat(chunks) })
        res.writeHead(r.status, { 'content-type': 'application/json' }).end(Buffer.from(await r.arrayBuffer()))
      })
  })
  await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r))
  t.teardown(async () => {
    proxy.closeAllConnections()
    proxy.close()
    await ext.close()
    rmSync(chainDir, { recursive: true, force: true })
    rmSync(dataDir, { recursive: true, force: true })
  })
  const signerKey = generatePrivateKey()
  await ext.request({ method: 'anvil_setBalance', params: [privateKeyToAccount(signerKey).address, '0x56bc75e2d63100000'] })
  const base = { PAYGATE_DATA_DIR: dataDir, PAYGATE_CHAIN_RPC_URL: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`, PAYGATE_CHAIN_CHAIN_ID: '31338', PAYGATE_CHAIN_SIGNER_KEY: signerKey }
  const dep = await runCli(base, ['deploy-ledger', '--with-token'])
  t.equal(dep.code, 0, dep.stderr)
  const addrs = JSON.parse(dep.stdout)
  const g = await spawnGateway({ ...base, PAYGATE_CHAIN_TOKEN: addrs.token, PAYGATE_CHAIN_LEDGER: addrs.ledger })
  t.teardown(() => g.stop('SIGKILL'))
  t.equal((await call(g.url, 'GET', '/readyz', null)).status, 200)

  hang = true
  const r = await timed(g.url, 'GET', '/readyz', null)
  t.same([r.status, r.body], [503, { status: 'not_ready', checks: { store: true, chain: false } }])
  t.ok(r.ms < 2500, `/readyz answered in ${r.ms} ms`)
  // The chain answers again while the hung requests are still open: each check asks anew.
  hang = false
  const until = Date.now() + 3_000
  let status = 0
  while (Date.now() < until && (status = (await call(g.url, 'GET', '/readyz', null)).status) !== 200) await new Promise((r) => setTimeout(r, 100))
  t.equal(status, 200, 'ready again within 3 s of the chain answering')
})
