import t from 'tap'
import { readFileSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { createPublicClient, createWalletClient, http, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { testDir } from '../helpers/gateway.js'
import { call, spawnGateway } from '../helpers/process.js'

/**
 * POST /v1/pay with an idempotencyKey, SIGKILLed after the target settled and before the
 * answer came back: after the restart the same key returns that payment (its answer lost
 * with the process) and never pays again.
 */
t.test('a request cut off by SIGKILL after settlement: the same idempotencyKey returns the payment, never a second one', async (t) => {
  const dataDir = testDir(t)
  const env = { PAYGATE_DATA_DIR: dataDir, PAYGATE_PAY_TIMEOUT_MS: '20000' }
  const first = await spawnGateway(env)
  t.teardown(() => first.stop('SIGKILL'))
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  let info = (await call(first.url, 'GET', '/v1/chain', acct)).body
  const facilitator = privateKeyToAccount(generatePrivateKey())
  const fund = (rpc: string) =>
    fetch(rpc, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'anvil_setBalance', params: [facilitator.address, '0x56bc75e2d63100000'] }),
    })
  await fund(info.rpcUrl)
  const clients = () => {
    const chain = viemChain(info.chainId, info.network, info.rpcUrl)
    return { pub: createPublicClient({ chain, transport: http(info.rpcUrl) }), wc: createWalletClient({ account: facilitator, chain, transport: http(info.rpcUrl) }) }
  }

  // A spec-shape target that settles each payment on chain; the first paid answer never comes.
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  let settlements = 0
  let hangNext = true
  const srv: Server = createServer(async (req, res) => {
    const xp = req.headers['x-payment']
    if (!xp) {
      const resource = `http://127.0.0.1:${(srv.address() as AddressInfo).port}${req.url}`
      return void res
        .writeHead(402, { 'content-type': 'application/json' })
        .end(JSON.stringify({ scheme: 'exact', network: `eip155:${info.chainId}`, token: info.token, amount: '50000', payTo, resource }))
    }
    const p = JSON.parse(Buffer.from(String(xp), 'base64').toString()).payload
    const { pub, wc } = clients()
    try {
      const hash = await wc.writeContract({
        address: info.token,
        abi: paygateUsdcAbi,
        functionName: 'transferWithAuthorization',
        args: [p.from, p.to, BigInt(p.amount), BigInt(p.validAfter), BigInt(p.validBefore), p.nonce, req.headers['x-payment-signature'] as Hex],
      })
      if ((await pub.waitForTransactionReceipt({ hash })).status === 'success') settlements++
    } catch (e) {
      return void res.writeHead(402, { 'content-type': 'application/json' }).end(JSON.stringify({ error: (e as Error).message.slice(0, 100) }))
    }
    if (hangNext) {
      hangNext = false
      return // settled; the answer never comes
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"report":42}')
  })
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    srv.closeAllConnections()
    return new Promise<void>((r) => srv.close(() => r()))
  })
  const base = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`

  await call(first.url, 'POST', '/v1/agents', acct, { agentId: 'crash' })
  const wallet = (await call(first.url, 'POST', '/v1/wallets', acct, { agentId: 'crash' })).body.address as Hex
  const body = { agentId: 'crash', endpoint: `${base}/report`, idempotencyKey: 'order-42' }
  const cut = call(first.url, 'POST', '/v1/pay', acct, body).catch(() => null)
  const t0 = Date.now()
  while (settlements === 0 && Date.now() - t0 < 20_000) await new Promise((r) => setTimeout(r, 50))
  t.equal(settlements, 1, 'the target settled the payment')
  t.equal(await first.stop('SIGKILL'), 'SIGKILL')
  await cut

  const second = await spawnGateway(env)
  t.teardown(() => second.stop('SIGKILL'))
  info = (await call(second.url, 'GET', '/v1/chain', acct)).body
  const balanceOf = (a: Hex) => clients().pub.readContract({ address: info.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [a] })
  const before = await balanceOf(wallet)

  // The reconciler settles the cut-off transaction at start; until then the key says retry later.
  let r = await call(second.url, 'POST', '/v1/pay', acct, body)
  const end = Date.now() + 20_000
  while (r.status === 503 && Date.now() < end) {
    t.equal(r.headers['retry-after'], '5')
    await new Promise((res) => setTimeout(res, 250))
    r = await call(second.url, 'POST', '/v1/pay', acct, body)
  }
  t.equal(r.status, 200, r.text)
  t.match(r.body, { protocol: 'x402', amountPaid: { usdc: 0.05 }, txHash: /^0x[0-9a-f]{64}$/, data: null, dataError: { error: 'upstream_body_lost' } })
  const again = await call(second.url, 'POST', '/v1/pay', acct, body)
  t.same(again.body, r.body, 'replayed as stored')
  t.equal(settlements, 1, 'never paid a second time')
  t.equal(await balanceOf(wallet), before, 'no money moved after the restart')
  const txs = (await call(second.url, 'GET', '/v1/transactions?agentId=crash', acct)).body.transactions
  t.same(
    txs.map((x: { status: string; txHash: string }) => [x.status, x.txHash]),
    [['paid', r.body.txHash]],
    'one transaction, paid, with the answered txHash',
  )
})
