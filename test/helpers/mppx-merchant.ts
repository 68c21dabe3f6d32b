/**
 * A real mppx server (the reference SDK of the HTTP "Payment" scheme, `mppx/server`) on
 * 127.0.0.1, port 0:
 *
 * - `GET /evm`: `evm/charge` of `price` USDC, settled on the local chain by calling the
 *   token's `transferWithAuthorization` from `facilitatorKey` (simulated first, so a used
 *   nonce is a 402 verification-failed, never gas).
 * - `GET /stripe`: `stripe/charge` of `cardPrice` USD through a fake Stripe client whose
 *   `paymentIntents.create` accepts only tokens the fake card provider issued, each once
 *   (Stripe's idempotency replays are reported as `idempotent-replayed`).
 * - `GET /multi`: both offers in one `WWW-Authenticate` header (mppx `compose`).
 * - `GET /stale`: the first request gets an evm challenge that has already expired; later
 *   ones a fresh challenge.
 *
 * mppx evm routes also emit an x402 v2 `PAYMENT-REQUIRED` header and accept
 * `PAYMENT-SIGNATURE`: a target offering both protocols.
 *
 * Faults: `fail503Once` answers the first credential 503 before verifying it;
 * `dropAfterSettleOnce` destroys the connection after the first settlement (money moved,
 * answer lost).
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import { Errors } from 'mppx'
import { Mppx, evm, stripe } from 'mppx/server'
import { BaseError, ContractFunctionRevertedError, getAddress, type Hex } from 'viem'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import type { FakeCardProvider } from './mpp-merchant.js'
import { clientsFor, listen, POLL_MS, RECEIPT_TIMEOUT_MS, serialSend, type Address, type LocalChain } from './merchants.js'

export interface MppxMerchantOptions {
  chain: LocalChain
  facilitatorKey: Hex
  recipient: Address
  /** Decimal USDC, e.g. "0.01". */
  price: string
  /** Decimal USD for stripe/charge (Stripe's minimum is 0.50). */
  cardPrice?: string
  card: FakeCardProvider
  faults?: { fail503Once?: boolean; dropAfterSettleOnce?: boolean }
}

export interface MppxMerchantStats {
  challenges: number
  /** Requests carrying `Authorization: Payment ...`. */
  credentials: string[]
  /** Requests carrying an x402 `PAYMENT-SIGNATURE`. */
  x402Credentials: number
  settlements: Hex[]
  stripeCharges: number
  acceptPayment: (string | null)[]
}

export interface MppxMerchant {
  url: string
  stats: MppxMerchantStats
  close(): Promise<void>
}

export async function startMppxMerchant(opts: MppxMerchantOptions): Promise<MppxMerchant> {
  const stats: MppxMerchantStats = { challenges: 0, credentials: [], x402Credentials: 0, settlements: [], stripeCharges: 0, acceptPayment: [] }
  const faults = { fail503: opts.faults?.fail503Once ?? false, drop: opts.faults?.dropAfterSettleOnce ?? false }
  const token = getAddress(opts.chain.token)
  const { account, publicClient, walletClient } = clientsFor(opts.chain, opts.facilitatorKey)
  let dropNext = false

  async function settle({ payload }: { payload: { from: Address; to: Address; value: string; validAfter: string; validBefore: string; nonce: Hex; signature: Hex } }) {
    const args = [payload.from, payload.to, BigInt(payload.value), BigInt(payload.validAfter), BigInt(payload.validBefore), payload.nonce, payload.signature] as const
    return serialSend(opts.chain.rpcUrl, account.address, async () => {
      try {
        const { request } = await publicClient.simulateContract({ account, address: token, abi: paygateUsdcAbi, functionName: 'transferWithAuthorization', args })
        const hash = await walletClient.writeContract(request)
        const receipt = await publicClient.waitForTransactionReceipt({ hash, timeout: RECEIPT_TIMEOUT_MS, pollingInterval: POLL_MS })
        if (receipt.status !== 'success') throw new Errors.VerificationFailedError({ reason: `settlement reverted ${hash}` })
        stats.settlements.push(hash)
        if (faults.drop) {
          faults.drop = false
          dropNext = true
        }
        return { reference: hash }
      } catch (e) {
        if (e instanceof Errors.PaymentError) throw e
        const revert = e instanceof BaseError ? e.walk((x) => x instanceof ContractFunctionRevertedError) : null
        throw new Errors.VerificationFailedError({ reason: `settlement rejected: ${(revert as ContractFunctionRevertedError | null)?.reason ?? (e as Error).message.split('\n')[0]}` })
      }
    })
  }

  const stripeSeen = new Map<string, { id: string; status: string }>()
  const fakeStripe = {
    paymentIntents: {
      async create(params: { shared_payment_granted_token?: string }, options?: { idempotencyKey?: string }) {
        const key = options?.idempotencyKey ?? ''
        const prior = stripeSeen.get(key)
        if (prior) return { ...prior, lastResponse: { headers: { 'idempotent-replayed': 'true' } } }
        if (!opts.card.redeem(String(params.shared_payment_granted_token))) throw new Error('No such shared payment token')
        const pi = { id: `pi_test_${stripeSeen.size + 1}`, status: 'succeeded' }
        stripeSeen.set(key, pi)
        stats.stripeCharges++
        return { ...pi, lastResponse: { headers: {} } }
      },
    },
  }

  const mppx = Mppx.create({
    secretKey: 'paygate-test-mppx-secret-key-0123456789',
    realm: 'merchant.test',
    methods: [
      evm.charge({ currency: token, chainId: opts.chain.chainId, decimals: 6, authorization: { name: 'USD Coin', version: '2' }, recipient: opts.recipient, settle: settle as never }),
      stripe.charge({ client: fakeStripe as never, networkId: 'internal', paymentMethodTypes: ['card'], currency: 'usd', decimals: 2 }),
    ],
  })
  let staleServed = false
  const cardPrice = opts.cardPrice ?? '0.50'
  const handlerFor = (path: string) => {
    if (path === '/evm') return mppx['evm/charge']({ amount: opts.price, description: 'evm, paid' })
    if (path === '/stripe') return mppx['stripe/charge']({ amount: cardPrice })
    if (path === '/multi') return mppx.compose(['evm/charge', { amount: opts.price, description: 'a, b "quoted"' }], ['stripe/charge', { amount: cardPrice }])
    if (path === '/stale') {
      const expired = !staleServed
      staleServed = true
      return mppx['evm/charge']({ amount: opts.price, ...(expired ? { expires: new Date(Date.now() - 60_000).toISOString() } : {}) })
    }
    return null
  }

  const l = await listen(async (req: IncomingMessage, res: ServerResponse) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname
    const auth = req.headers.authorization
    stats.acceptPayment.push((req.headers['accept-payment'] as string | undefined) ?? null)
    if (auth?.startsWith('Payment ')) stats.credentials.push(auth)
    if (req.headers['payment-signature']) stats.x402Credentials++
    if (auth?.startsWith('Payment ') && faults.fail503) {
      faults.fail503 = false
      res.writeHead(503, { 'content-type': 'application/json' })
      return res.end('{"error":"unavailable"}')
    }
    const h = handlerFor(path)
    if (!h) {
      res.writeHead(404)
      return res.end()
    }
    try {
      const origWrite = res.writeHead.bind(res)
      res.writeHead = ((status: number, ...rest: unknown[]) => {
        if (status === 402) stats.challenges++
        return (origWrite as (...a: unknown[]) => ServerResponse)(status, ...rest)
      }) as typeof res.writeHead
      const result = await Mppx.toNodeListener(h)(req, res)
      if (result.status === 402) return
      if (dropNext) {
        dropNext = false
        req.socket.destroy()
        return
      }
      res.setHeader('content-type', 'application/json')
      res.end(JSON.stringify({ ok: true, paid: 'mppx', path }))
    } catch (e) {
      if (!res.headersSent) {
        res.writeHead(500)
        res.end(String(e))
      }
    }
  })
  return { url: l.url, stats, close: () => l.close() }
}
