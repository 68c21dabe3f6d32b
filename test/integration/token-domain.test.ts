import t from 'tap'
import { readFileSync, rmSync } from 'node:fs'
import solc from 'solc'
import { createPublicClient, createWalletClient, getAddress, http, type Hex, type PublicClient } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { deployContracts, viemChain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { startDevnet } from '../../src/chain/devnet/index.js'
import { PaygateError } from '../../src/errors/index.js'
import { startTestGateway, tempDir, testDir } from '../helpers/gateway.js'
import { startSpecMerchant } from '../helpers/merchants.js'

/**
 * A token whose EIP-712 domain is not "USD Coin"/"2" (Base Sepolia USDC's name() is "USDC"),
 * configured as Paygate's chain token: a merchant in the spec's simple shape (no `extra`)
 * is paid over the domain the token reports, and the transfer settles on chain.
 *
 * The tokens are PaygateUSDC compiled here with name "USDC": one as it is (it answers
 * EIP-5267 eip712Domain()), one without eip712Domain() (like Circle's FiatToken: only
 * name() and version()).
 */
const CHAIN_ID = 31339
const PRICE = 10_000n

function compileUsdcVariants(): { withEip5267: Hex; nameVersionOnly: Hex } {
  const source = readFileSync(new URL('../../contracts/PaygateUSDC.sol', import.meta.url), 'utf8')
  const renamed = source.replace('string public constant name = "USD Coin";', 'string public constant name = "USDC";')
  const noEip5267 = renamed.replace('function eip712Domain()', 'function eip712DomainHidden()')
  if (renamed === source || noEip5267 === renamed) throw new Error("contracts/PaygateUSDC.sol changed: update this test's variants")
  const input = {
    language: 'Solidity',
    sources: { 'a.sol': { content: renamed }, 'b.sol': { content: noEip5267 } },
    // Unoptimised: half the compile time, and the bytecode size does not matter here.
    settings: { optimizer: { enabled: false }, evmVersion: 'paris', outputSelection: { '*': { PaygateUSDC: ['evm.bytecode.object'] } } },
  }
  const out = JSON.parse(solc.compile(JSON.stringify(input))) as {
    errors?: { severity: string; formattedMessage: string }[]
    contracts: Record<string, { PaygateUSDC: { evm: { bytecode: { object: string } } } }>
  }
  const errors = (out.errors ?? []).filter((e) => e.severity === 'error')
  if (errors.length) throw new Error(errors.map((e) => e.formattedMessage).join('\n'))
  const code = (file: string): Hex => `0x${out.contracts[file]!.PaygateUSDC.evm.bytecode.object}`
  return { withEip5267: code('a.sol'), nameVersionOnly: code('b.sol') }
}

const chainDir = tempDir()
const ext = await startDevnet({ dataDir: chainDir, chainId: CHAIN_ID, host: '127.0.0.1', port: 0 })
t.teardown(async () => {
  await ext.close()
  rmSync(chainDir, { recursive: true, force: true })
})
const chain = viemChain(CHAIN_ID, 'ext', ext.rpcUrl)
const pub = createPublicClient({ chain, transport: http(ext.rpcUrl), pollingInterval: 20 }) as PublicClient
async function fundedKey(): Promise<Hex> {
  const key = generatePrivateKey()
  await ext.request({ method: 'anvil_setBalance', params: [privateKeyToAccount(key).address, '0x56bc75e2d63100000'] })
  return key
}
const owner = privateKeyToAccount(await fundedKey())
const ownerWallet = createWalletClient({ chain, transport: http(ext.rpcUrl), account: owner, pollingInterval: 20 })
async function deployToken(bytecode: Hex): Promise<Hex> {
  const hash = await ownerWallet.deployContract({ abi: paygateUsdcAbi, bytecode, args: [owner.address] })
  const receipt = await pub.waitForTransactionReceipt({ hash })
  return getAddress(receipt.contractAddress!)
}
const balanceOf = (token: Hex, a: Hex): Promise<bigint> => pub.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [a] })

const variants = compileUsdcVariants()
const tokens = { withEip5267: await deployToken(variants.withEip5267), nameVersionOnly: await deployToken(variants.nameVersionOnly) }

/** Paygate on the external chain with `token`; its own signer and ledger. */
async function paygateWith(token: Hex, dataDir?: string) {
  const signerKey = await fundedKey()
  const signer = privateKeyToAccount(signerKey)
  const { ledger } = await deployContracts(pub, createWalletClient({ chain, transport: http(ext.rpcUrl), account: signer }), signer, { token: false })
  return startTestGateway({
    ...(dataDir ? { dataDir } : {}),
    env: {
      PAYGATE_CHAIN_RPC_URL: ext.rpcUrl,
      PAYGATE_CHAIN_CHAIN_ID: String(CHAIN_ID),
      PAYGATE_CHAIN_TOKEN: token,
      PAYGATE_CHAIN_LEDGER: ledger,
      PAYGATE_CHAIN_SIGNER_KEY: signerKey,
    },
  })
}

for (const [kind, token] of Object.entries(tokens)) {
  t.test(`a "USDC"/"2" token (${kind}): the spec's simple shape is signed over the token's domain and settles`, async (t) => {
    t.same(await pub.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'name' }), 'USDC', 'the token is named USDC')
    const gw = await paygateWith(token)
    t.teardown(() => gw.close())
    const info = (await gw.api('GET', '/v1/chain')).body
    t.match(info, { token, tokenDomain: { name: 'USDC', version: '2' } }, 'GET /v1/chain shows the domain read from the token')

    await gw.api('POST', '/v1/agents', { body: { agentId: 'buyer' } })
    const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: 'buyer' } })).body.address as Hex
    await pub.waitForTransactionReceipt({ hash: await ownerWallet.writeContract({ address: token, abi: paygateUsdcAbi, functionName: 'mint', args: [wallet, 1_000_000n] }) })

    const payTo = privateKeyToAccount(generatePrivateKey()).address
    const m = await startSpecMerchant({ shape: 'simple', chain: { rpcUrl: ext.rpcUrl, chainId: CHAIN_ID, token }, facilitatorKey: await fundedKey(), payTo, price: PRICE })
    t.teardown(() => m.close())
    const r = await gw.api('POST', '/v1/pay', { body: { agentId: 'buyer', endpoint: `${m.url}/paid`, method: 'GET' } })
    t.equal(r.status, 200, r.text)
    t.match(r.body, { protocol: 'x402', amountPaid: { usdc: 0.01 }, status: 200, data: { ok: true, paid: 'spec' } })
    t.same(m.stats.errors, [], 'the merchant refused nothing')
    t.equal(m.stats.settlements, 1, 'settled once')
    t.equal(await balanceOf(token, payTo), PRICE, 'the merchant received the price on chain')
    t.equal(await balanceOf(token, wallet), 1_000_000n - PRICE, 'the agent wallet paid it')
  })
}

t.test('a chain token that answers neither eip712Domain() nor name()/version() stops the start', async (t) => {
  const dataDir = testDir(t)
  // A contract, but no token: the ledger.
  const signer = privateKeyToAccount(await fundedKey())
  const { ledger } = await deployContracts(pub, createWalletClient({ chain, transport: http(ext.rpcUrl), account: signer }), signer, { token: false })
  const err = await paygateWith(ledger, dataDir).then(
    (gw) => gw.close().then(() => null),
    (e: unknown) => e,
  )
  t.type(err, PaygateError)
  t.match(err, { code: 'invalid_config', detail: new RegExp(`chain\\.token = ${ledger} answers neither eip712Domain\\(\\) nor name\\(\\) and version\\(\\)`) })
})
