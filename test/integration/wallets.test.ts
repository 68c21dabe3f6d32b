import t from 'tap'
import { createPublicClient, createWalletClient, http, parseSignature, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { randomBytes } from 'node:crypto'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { viemChain } from '../../src/chain/chain.js'
import { TRANSFER_WITH_AUTHORIZATION_TYPES } from '../../src/protocols/x402.js'
import { startTestGateway } from '../helpers/gateway.js'

const gw = await startTestGateway()
t.teardown(() => gw.close())
const chainInfo = (await gw.api('GET', '/v1/chain')).body
const chain = viemChain(chainInfo.chainId, chainInfo.network, chainInfo.rpcUrl)
const pub = createPublicClient({ chain, transport: http(chainInfo.rpcUrl), pollingInterval: 20 })
const onChainBalance = (address: Hex) => pub.readContract({ address: chainInfo.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [address] })

const alice = (await gw.api('POST', '/v1/agents', { body: { agentId: 'alice' } })).body
await gw.api('POST', '/v1/agents', { body: { agentId: 'bob' } })

t.test('GET /v1/chain describes the embedded chain', async (t) => {
  t.match(chainInfo, {
    network: 'paygate-devnet',
    chainId: 31337,
    rpcUrl: /^http:\/\/127\.0\.0\.1:\d+$/,
    token: /^0x[0-9a-fA-F]{40}$/,
    ledger: /^0x[0-9a-fA-F]{40}$/,
  })
  t.type(chainInfo.blockNumber, 'number')
  t.equal(await pub.readContract({ address: chainInfo.token, abi: paygateUsdcAbi, functionName: 'decimals' }), 6)
  t.equal(await pub.readContract({ address: chainInfo.token, abi: paygateUsdcAbi, functionName: 'name' }), 'USD Coin')
  t.same((await gw.api('GET', '/readyz', { key: null })).body.checks, { store: true, chain: true })
  t.equal((await gw.api('GET', '/v1/chain', { key: alice.apiKey })).status, 403)
})

t.test('create a wallet: funded by the dev faucet, balance read from the token', async (t) => {
  const r = await gw.api('POST', '/v1/wallets', { body: { agentId: 'alice' } })
  t.equal(r.status, 201)
  t.same(Object.keys(r.body).sort(), ['address', 'network'])
  t.equal(r.body.network, 'paygate-devnet')
  const w = await gw.api('GET', '/v1/wallets/alice')
  t.equal(w.status, 200)
  t.equal(w.body.address, r.body.address)
  t.equal(w.body.balance.usdc, 1000, 'faucet default: 1000 USDC')
  t.equal(BigInt(w.body.balance.usdc * 1e6), await onChainBalance(r.body.address), 'balance.usdc equals balanceOf on chain')
  t.ok((await pub.getBalance({ address: r.body.address })) > 0n, 'gas from the faucet')
  t.notMatch(JSON.stringify(w.body), /key|secret/i, 'no key material in the answer')

  const dup = await gw.api('POST', '/v1/wallets', { body: { agentId: 'alice' } })
  t.same([dup.status, dup.body.error], [409, 'conflict'])
  t.same((await gw.api('POST', '/v1/wallets', { body: {} })).body.field, 'agentId')
  // A client written from the spec: the wallet POST creates the agent, its key comes from POST /v1/agents/<id>/keys.
  const ghost = await gw.api('POST', '/v1/wallets', { body: { agentId: 'ghost' } })
  t.same([ghost.status, ghost.body.network], [201, 'paygate-devnet'])
  t.match((await gw.api('GET', '/v1/agents/ghost')).body, { agentId: 'ghost' })
  const ghostKey = (await gw.api('POST', '/v1/agents/ghost/keys')).body.apiKey
  t.equal((await gw.api('GET', '/v1/wallets/ghost', { key: ghostKey })).body.address, ghost.body.address, 'its own key reads it')
  for (const agentId of ['invoke', 'a b', '.']) {
    const r = await gw.api('POST', '/v1/wallets', { body: { agentId } })
    t.same([r.status, r.body.field], [400, 'agentId'], `agentId ${JSON.stringify(agentId)} refused`)
  }
  t.same((await gw.api('GET', '/v1/wallets/bob')).status, 404, 'agent without a wallet')
})

t.test('wallet access with agent keys', async (t) => {
  t.equal((await gw.api('GET', '/v1/wallets/alice', { key: alice.apiKey })).status, 200, 'own wallet readable')
  const bobKey = (await gw.api('POST', '/v1/agents/bob/keys')).body.apiKey
  t.equal((await gw.api('GET', '/v1/wallets/alice', { key: bobKey })).status, 403)
  t.equal((await gw.api('POST', '/v1/wallets', { key: alice.apiKey, body: { agentId: 'alice' } })).status, 403)
  t.equal((await gw.api('POST', '/v1/wallets/alice/faucet', { key: alice.apiKey })).status, 403)
})

t.test('faucet tops up on the embedded chain', async (t) => {
  const before = (await gw.api('GET', '/v1/wallets/alice')).body.balance.usdc
  const r = await gw.api('POST', '/v1/wallets/alice/faucet', { body: { usdc: 2.5 } })
  t.equal(r.status, 200)
  t.equal(r.body.funded.usdc, 2.5)
  t.equal(r.body.balance.usdc, before + 2.5)
  t.equal((await gw.api('POST', '/v1/wallets/alice/faucet', { body: { usdc: -1 } })).body.field, 'usdc')
  t.equal((await gw.api('POST', '/v1/wallets/alice/faucet', { body: { usdc: 0.0000001 } })).body.field, 'usdc')
  t.equal((await gw.api('POST', '/v1/wallets/bob/faucet', {})).status, 404)
})

t.test("an EIP-3009 transfer signed with the agent's wallet settles once; its replay reverts", async (t) => {
  const account = await gw.gw.wallets.wallets.account('alice')
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const relayer = privateKeyToAccount(generatePrivateKey())
  await pub.request({ method: 'anvil_setBalance' as never, params: [relayer.address, '0xde0b6b3a7640000'] as never })
  const wallet = createWalletClient({ chain, transport: http(chainInfo.rpcUrl), account: relayer })
  const now = BigInt(Math.floor(Date.now() / 1000))
  const auth = { from: account.address, to: payTo, value: 1_250_000n, validAfter: 0n, validBefore: now + 60n, nonce: `0x${randomBytes(32).toString('hex')}` as Hex }
  const signature = await account.signTypedData({
    domain: { name: 'USD Coin', version: '2', chainId: chainInfo.chainId, verifyingContract: chainInfo.token },
    types: TRANSFER_WITH_AUTHORIZATION_TYPES,
    primaryType: 'TransferWithAuthorization',
    message: auth,
  })
  const fromBefore = await onChainBalance(account.address)
  const { v, r, s } = parseSignature(signature)
  const args = [auth.from, auth.to, auth.value, auth.validAfter, auth.validBefore, auth.nonce, Number(v), r, s] as const
  const hash = await wallet.writeContract({ address: chainInfo.token, abi: paygateUsdcAbi, functionName: 'transferWithAuthorization', args })
  t.equal((await pub.waitForTransactionReceipt({ hash })).status, 'success')
  t.equal(await onChainBalance(payTo), 1_250_000n)
  t.equal(await onChainBalance(account.address), fromBefore - 1_250_000n)
  t.equal(await pub.readContract({ address: chainInfo.token, abi: paygateUsdcAbi, functionName: 'authorizationState', args: [auth.from, auth.nonce] }), true)
  await t.rejects(pub.simulateContract({ account: relayer, address: chainInfo.token, abi: paygateUsdcAbi, functionName: 'transferWithAuthorization', args }), 'the replay reverts')
  const balanceAfter = (await gw.api('GET', '/v1/wallets/alice')).body.balance.usdc
  t.equal(BigInt(Math.round(balanceAfter * 1e6)), fromBefore - 1_250_000n, 'the API sees the transfer')
})

t.test('deleting an agent archives its wallet key instead of destroying it', async (t) => {
  await gw.api('POST', '/v1/agents', { body: { agentId: 'temp' } })
  const w = (await gw.api('POST', '/v1/wallets', { body: { agentId: 'temp' } })).body
  t.equal((await gw.api('DELETE', '/v1/agents/temp')).status, 204)
  const archived = await gw.gw.store.collection<{ address: string }>('walletArchive').get(w.address.toLowerCase())
  t.equal(archived?.address, w.address)
  t.equal((await gw.api('GET', '/v1/wallets/temp')).status, 404)
})

t.test('the embedded chain: JSON-RPC on loopback with dev methods, time following the wall clock', async (t) => {
  const rpc = async (method: string, params: unknown[] = []): Promise<any> => {
    const r = await fetch(chainInfo.rpcUrl, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }) })
    const j = (await r.json()) as { result?: unknown; error?: { message: string } }
    if (j.error) throw new Error(`${method}: ${j.error.message}`)
    return j.result
  }
  t.equal(Number(await rpc('eth_chainId')), 31337)
  const who = privateKeyToAccount(generatePrivateKey()).address
  await rpc('anvil_setBalance', [who, '0x10'])
  t.equal(BigInt(await rpc('eth_getBalance', [who, 'latest'])), 16n, 'anvil_setBalance')
  await rpc('hardhat_setBalance', [who, '0x20'])
  t.equal(BigInt(await rpc('eth_getBalance', [who, 'latest'])), 32n, 'hardhat_setBalance')
  const before = Number(await rpc('eth_blockNumber'))
  await rpc('evm_mine')
  t.equal(Number(await rpc('eth_blockNumber')), before + 1, 'evm_mine')
  const ts = Number((await rpc('eth_getBlockByNumber', ['latest', false])).timestamp)
  t.ok(Math.abs(ts - Date.now() / 1000) < 5, `block time ${ts} follows the wall clock`)
  // A batch request works too.
  const batch = await fetch(chainInfo.rpcUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify([
      { jsonrpc: '2.0', id: 1, method: 'eth_chainId' },
      { jsonrpc: '2.0', id: 2, method: 'eth_blockNumber' },
    ]),
  })
  t.equal(((await batch.json()) as unknown[]).length, 2, 'JSON-RPC batches')
  await rpc('evm_increaseTime', [120])
  await rpc('evm_mine')
  const ts2 = Number((await rpc('eth_getBlockByNumber', ['latest', false])).timestamp)
  t.ok(ts2 - ts >= 120, 'evm_increaseTime moves chain time forward')
})
