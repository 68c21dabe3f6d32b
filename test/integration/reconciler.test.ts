import t from 'tap'
import { randomBytes } from 'node:crypto'
import { createWalletClient, http, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { viemChain } from '../../src/chain/chain.js'
import { newTxId, type TxRecord } from '../../src/ledger/transactions.js'
import { hold } from '../../src/policy/usage.js'
import { typedData, typedDataDigest } from '../../src/protocols/x402.js'
import { startTestGateway } from '../helpers/gateway.js'

/**
 * Payments whose outcome was not known (a crash mid-payment, or an answer lost while the
 * chain could not be asked) are settled by the reconciler: used on chain = paid, expired
 * unused = released, never signed = released.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const info = (await gw.api('GET', '/v1/chain')).body
await gw.api('POST', '/v1/agents', { body: { agentId: 'r' } })
await gw.api('PUT', '/v1/policies/r', { body: { dailyBudget: { usdc: 5 } } })
const wallet = (await gw.api('POST', '/v1/wallets', { body: { agentId: 'r' } })).body.address as Hex
const signer = await gw.gw.wallets.wallets.signer('r')
const payTo = privateKeyToAccount(generatePrivateKey()).address
const relayer = privateKeyToAccount(generatePrivateKey())
await gw.gw.chain.publicClient.request({ method: 'anvil_setBalance' as never, params: [relayer.address, '0xde0b6b3a7640000'] as never })
const relayerClient = createWalletClient({ chain: viemChain(info.chainId, info.network, info.rpcUrl), transport: http(info.rpcUrl), account: relayer })

/** Store a transaction left in flight, with its reservation, as a crash would leave it. */
async function leftInFlight(amount: bigint, opts: { signed: boolean; validBefore: bigint; status: 'pending' | 'unknown'; signatureOnDisk?: boolean }) {
  const now = Date.now()
  const auth = { from: wallet, to: payTo, value: amount, validAfter: 0n, validBefore: opts.validBefore, nonce: `0x${randomBytes(32).toString('hex')}` as Hex }
  const offer = { asset: info.token, extra: { name: 'USD Coin', version: '2' } }
  const signature = signer.signDigest65(typedDataDigest(typedData(offer as never, auth, info.chainId, { name: 'USD Coin', version: '2' })))
  const rec: TxRecord = {
    id: newTxId(now),
    agentId: 'r',
    status: opts.status,
    createdAt: now,
    updatedAt: now,
    endpoint: 'http://127.0.0.1:1/thing',
    method: 'GET',
    protocol: 'x402',
    amount: amount.toString(),
    txHash: null,
    parentTxHash: null,
    depth: 0,
    ...(opts.signed
      ? {
          authorization: {
            from: auth.from,
            to: auth.to,
            value: String(amount),
            validAfter: '0',
            validBefore: String(opts.validBefore),
            nonce: auth.nonce,
            signature: opts.signatureOnDisk === false ? '' : signature,
          },
        }
      : {}),
  }
  const usage = hold(await gw.gw.policies.usageOf('r'), { id: rec.id, amount: rec.amount, at: now })
  await gw.gw.store.batch([gw.gw.policies.usageOp('r', usage), ...gw.gw.transactions.ops(rec)])
  return { rec, auth, signature }
}

/** What a merchant's facilitator does with a signed authorization: transferWithAuthorization, mined. */
async function settleOnChain(auth: Awaited<ReturnType<typeof leftInFlight>>['auth'], signature: Hex): Promise<void> {
  const hash = await relayerClient.writeContract({
    address: info.token,
    abi: paygateUsdcAbi,
    functionName: 'transferWithAuthorization',
    args: [auth.from, auth.to, auth.value, auth.validAfter, auth.validBefore, auth.nonce, signature],
  })
  await gw.gw.chain.publicClient.waitForTransactionReceipt({ hash })
}

t.test('used on chain: recorded as paid, reservation committed, ledger record written', async (t) => {
  const nowS = BigInt(Math.floor(Date.now() / 1000))
  const { rec, auth, signature } = await leftInFlight(1_000_000n, { signed: true, validBefore: nowS + 300n, status: 'unknown' })
  // The merchant settled it before the answer was lost.
  await settleOnChain(auth, signature)
  await gw.gw.reconciler.runOnce()
  const after = (await gw.api('GET', `/v1/transactions/${rec.id}`)).body
  t.equal(after.status, 'paid')
  t.match(after.txHash, /^0x[0-9a-f]{64}$/)
  t.same((await gw.api('GET', '/v1/policies/r')).body.dailyBudget, { usdc: 5, usedToday: 1 }, 'the reservation became spend')
  t.same((await gw.gw.policies.usageOf('r')).holds, [])
  t.ok(await gw.gw.outbox.drain(10_000))
})

t.test('expired unused: failed and released; still valid: kept', async (t) => {
  const nowS = BigInt(Math.floor(Date.now() / 1000))
  const expired = await leftInFlight(500_000n, { signed: true, validBefore: nowS - 1n, status: 'unknown' })
  const live = await leftInFlight(700_000n, { signed: true, validBefore: nowS + 600n, status: 'unknown' })
  await gw.gw.reconciler.runOnce()
  t.equal((await gw.gw.transactions.get(expired.rec.id))!.status, 'failed')
  t.equal((await gw.gw.transactions.get(live.rec.id))!.status, 'unknown', 'may still settle: kept held')
  t.same(
    (await gw.gw.policies.usageOf('r')).holds?.map((h) => h.id),
    [live.rec.id],
  )
  t.equal((await gw.api('GET', '/v1/policies/r')).body.dailyBudget.usedToday, 1, 'released spend is not counted')
})

t.test('never signed (crash before signing): failed and released', async (t) => {
  const { rec } = await leftInFlight(100_000n, { signed: false, validBefore: 0n, status: 'pending' })
  await gw.gw.reconciler.runOnce()
  t.equal((await gw.gw.transactions.get(rec.id))!.status, 'failed')
  t.notOk((await gw.gw.policies.usageOf('r')).holds?.some((h) => h.id === rec.id))
})

t.test('an off-chain proof (MPP intent or card token) with its outcome unknown: held until it expires, then released', async (t) => {
  const now = Date.now()
  const mk = async (expiresAt: number) => {
    const { rec } = await leftInFlight(200_000n, { signed: false, validBefore: 0n, status: 'unknown' })
    const next: TxRecord = { ...rec, protocol: 'mpp', rail: 'card', authorization: { kind: 'card', expiresAt, wire: { type: 'card', provider: 'p', token: 'tok' } } }
    await gw.gw.store.batch(gw.gw.transactions.ops(next, rec))
    return next
  }
  const live = await mk(now + 600_000)
  const gone = await mk(now - 1)
  await gw.gw.reconciler.runOnce()
  t.equal((await gw.gw.transactions.get(live.id))!.status, 'unknown', 'no chain to ask: kept held while redeemable')
  t.equal((await gw.gw.transactions.get(gone.id))!.status, 'failed')
  const holds = (await gw.gw.policies.usageOf('r')).holds?.map((h) => h.id) ?? []
  t.ok(holds.includes(live.id))
  t.notOk(holds.includes(gone.id))
})

t.test('a reservation written before its signature (the engine signs while it is written): settled from its fields', async (t) => {
  const nowS = BigInt(Math.floor(Date.now() / 1000))
  // Crashed after the signed authorization left: the merchant settled it; the disk has the unsigned fields.
  const used = await leftInFlight(300_000n, { signed: true, signatureOnDisk: false, validBefore: nowS + 300n, status: 'pending' })
  const { auth, signature } = used
  await settleOnChain(auth, signature)
  // Crashed before anything left, and it has expired since.
  const unsent = await leftInFlight(200_000n, { signed: true, signatureOnDisk: false, validBefore: nowS - 1n, status: 'pending' })
  await gw.gw.reconciler.runOnce()
  t.equal((await gw.api('GET', `/v1/transactions/${used.rec.id}`)).body.status, 'paid')
  t.equal((await gw.api('GET', `/v1/transactions/${unsent.rec.id}`)).body.status, 'failed')
  const holds = (await gw.gw.policies.usageOf('r')).holds ?? []
  t.notOk(
    holds.some((h) => h.id === used.rec.id || h.id === unsent.rec.id),
    'both reservations settled',
  )
  t.ok(await gw.gw.outbox.drain(10_000))
})
