import t from 'tap'
import pg from 'pg'
import type { Address } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { gasFundedKey, replicaChain, spawnReplicas } from '../helpers/replica-chain.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { call, type GatewayProcess } from '../helpers/process.js'

// Two gateways and a chain on a 2-core machine shared with other tests.
t.setTimeout(600_000)

const CHAIN_ID = 31340
const MASTER_KEY = 'ac'.repeat(32)
const PRICE = 1000n

/**
 * The funds check with two gateway processes on one PostgreSQL database: every paid payment
 * adds to the wallet's committed total in the store (walletSpent) with its usage, and each
 * replica's estimate subtracts the other's payments: a wallet paid down through B is not
 * overspent through A on A's older chain reading.
 */
t.test("each replica's funds check counts the other's payments", async (t) => {
  // The bank is minted before the replicas start (the signer's later nonces are theirs).
  const { anvil, addrs, pub, url, env: shared, fund } = await replicaChain(t, CHAIN_ID, 1_000_000n)
  const { replicas, acct } = await spawnReplicas(t, { ...shared, PAYGATE_MASTER_KEY: MASTER_KEY }, 2, false)
  const [a, b] = replicas as [GatewayProcess, GatewayProcess]

  const facilitatorKey = await gasFundedKey(anvil)
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const m = await startV2Merchant({ chain: { rpcUrl: anvil.url, chainId: CHAIN_ID, token: addrs.token }, facilitatorKey, payTo, price: PRICE })
  t.teardown(() => m.close())
  t.equal((await call(a.url, 'POST', '/v1/agents', acct, { agentId: 'w' })).status, 201)
  const wallet = (await call(a.url, 'POST', '/v1/wallets', acct, { agentId: 'w' })).body.address as Address
  // Funds for five payments.
  await fund(wallet, 5n * PRICE)
  const pay = (g: GatewayProcess) => call(g.url, 'POST', '/v1/pay', acct, { agentId: 'w', endpoint: `${m.url}/paid` })

  t.equal((await pay(a)).status, 200, 'one through A (A reads the chain: five payments of funds)')
  for (let i = 0; i < 3; i++) t.equal((await pay(b)).status, 200, `through B (${i + 1})`)
  // One payment of funds is left on chain; A's reading still says five, less what every replica committed since.
  t.equal((await pay(a)).status, 200, 'the fifth through A')
  const sixth = await pay(a)
  t.equal(sixth.status, 402, sixth.text)
  t.equal(sixth.body.error, 'insufficient_funds', 'the sixth is refused by the funds check, before the merchant is asked')
  t.equal(m.stats.settleCalls, 5, 'the merchant settled five, and was asked to settle nothing more')
  const onChain = await pub.readContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [wallet] })
  t.equal(onChain, 0n, 'the wallet is empty')

  const db = new pg.Client({ connectionString: url })
  await db.connect()
  t.teardown(() => db.end())
  const r = await db.query<{ value: string }>(`SELECT value FROM paygate_state WHERE coll = 'walletSpent' AND key = $1`, [Buffer.from(wallet.toLowerCase())])
  t.equal(JSON.parse(r.rows[0]!.value), (5n * PRICE).toString(), "the wallet's committed total holds both replicas' payments")
})
