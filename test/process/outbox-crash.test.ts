import t from 'tap'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { createPublicClient, http, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../../src/chain/chain.js'
import { testDir } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { call, spawnGateway } from '../helpers/process.js'

t.test('SIGKILL right after payments: after restart every ledger record reaches the chain with the same txHash', async (t) => {
  const dataDir = testDir(t)
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  const info = (await call(first.url, 'GET', '/v1/chain', acct)).body
  const facilitatorKey = generatePrivateKey()
  await fetch(info.rpcUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'anvil_setBalance', params: [privateKeyToAccount(facilitatorKey).address, '0x56bc75e2d63100000'] }),
  })
  const m = await startV2Merchant({ chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token }, facilitatorKey, payTo: privateKeyToAccount(generatePrivateKey()).address, price: 1000n })
  await call(first.url, 'POST', '/v1/agents', acct, { agentId: 'crash' })
  await call(first.url, 'POST', '/v1/wallets', acct, { agentId: 'crash' })

  const paid = await Promise.all(Array.from({ length: 12 }, () => call(first.url, 'POST', '/v1/pay', acct, { agentId: 'crash', endpoint: `${m.url}/paid` })))
  t.same(
    paid.map((p) => p.status),
    Array(12).fill(200),
  )
  const hashes = paid.map((p) => p.body.txHash as Hex)
  t.equal(new Set(hashes).size, 12, 'one ledger transaction per payment')
  t.equal(await first.stop('SIGKILL'), 'SIGKILL')
  await m.close()

  const second = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => second.stop('SIGKILL'))
  const info2 = (await call(second.url, 'GET', '/v1/chain', acct)).body
  const pub = createPublicClient({ chain: viemChain(info2.chainId, info2.network, info2.rpcUrl), transport: http(info2.rpcUrl) })
  const end = Date.now() + 20_000
  let confirmed = 0
  while (Date.now() < end) {
    const views = await Promise.all(hashes.map((h) => call(second.url, 'GET', `/v1/transactions/${h}`, acct)))
    confirmed = views.filter((v) => v.body.ledger?.status === 'confirmed').length
    if (confirmed === hashes.length) break
    await new Promise((r) => setTimeout(r, 100))
  }
  t.equal(confirmed, 12, 'every record confirmed after the restart')
  for (const h of hashes) {
    const tx = (await call(second.url, 'GET', `/v1/transactions/${h}`, acct)).body
    t.match(tx, { status: 'paid', txHash: h })
    t.equal((await pub.getTransactionReceipt({ hash: h })).status, 'success', 'the same txHash is on chain')
  }
})
