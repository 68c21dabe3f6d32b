/**
 * A merchant for the spec's MPP shape (`mpp/1.0`), written for the tests (no public
 * implementation exists). HTTP on 127.0.0.1, port 0.
 *
 * - `GET /paid` and `POST /paid` without a valid `X-MPP-Session`: 402 with
 *   `{protocol: "mpp/1.0", amount: {value, currency}, paymentMethods, sessionSupported,
 *   paymentEndpoint: "/mpp/pay", payTo?, network?, token?, sessionTtlSeconds?}` (or the
 *   `rawBody` given). With `x402: true` the same 402 also carries an x402 v2
 *   `PAYMENT-REQUIRED` header, and a `PAYMENT-SIGNATURE` retry is settled on chain.
 * - `POST /mpp/pay` `{method, amount, authorization, resource}`: checks the method was
 *   offered and the amount echoed exactly, then verifies the authorization
 *   cryptographically: `eip3009` by EIP-712 recovery and settlement on chain with
 *   `transferWithAuthorization` (receipt awaited; a used nonce is refused); `eip712-intent`
 *   by recovery of the payer over the documented domain ("Paygate MPP", "1", chainId),
 *   nonces deduplicated; `card` by asking the fake card provider whether it issued the
 *   token (each token redeemed once). Success: 200 with the resource (`GET /paid`'s
 *   body) plus `X-MPP-Session` (and `X-MPP-Session-Expires` when `sessionHeaderTtl` is
 *   set). A resend of an accepted proof gets the same session back (idempotent).
 * - With a valid session: `GET /paid` -> `{ok: true, paid: "mpp"}`; `POST /paid` echoes
 *   the request body with its content type. An unknown or expired session gets the 402
 *   (or 401 with `refuseSessionWith: 401`).
 * - `GET /free` -> `{ok: true, free: true}`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http'
import { randomBytes } from 'node:crypto'
import { getAddress, parseUnits, recoverTypedDataAddress, type Hex } from 'viem'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { clientsFor, listen, RECEIPT_TIMEOUT_MS, POLL_MS, serialSend, TRANSFER_TYPES, type Address, type LocalChain } from './merchants.js'

export interface MppMerchantOptions {
  chain: LocalChain
  /** Pays the gas of on-chain settlement (fund it first). */
  facilitatorKey: Hex
  /** Recipient of EIP-3009 payments; null: the 402 names none and payers send signed intents. */
  payTo: Address | null
  /** Decimal price, e.g. "0.01". */
  price: string
  /** USDC base units an intent must carry (default: the price at 1:1). */
  expectUnits?: bigint
  currency?: string
  methods: string[]
  sessionSupported?: boolean
  /** Offered in the body as `sessionTtlSeconds`. */
  sessionTtlSeconds?: number
  /** Sent as `X-MPP-Session-Expires` (seconds) on the payment answer. */
  sessionHeaderTtl?: number
  /** Name `network`/`token` in the 402 (default: both, on the local chain). */
  network?: string | null
  token?: Address | null
  refuseSessionWith?: 401 | 402
  /** Also offer x402 v2 in the same 402. */
  x402?: boolean
  /** Replace the 402 body (malformed-offer tests). */
  rawBody?: unknown
  /** Answer the first N payment POSTs 503 before verifying anything. */
  failPaymentsFirst?: number
  card?: FakeCardProvider
  /** Accept `{type: "lightning", preimage}` proofs whose preimage this returns true for. */
  lightning?: (preimage: string) => boolean
}

export interface MppMerchantStats {
  challenges: number
  paymentPosts: number
  /** Accepted payments (new proofs, not resends). */
  payments: number
  settlements: number
  intents: number
  cardCharges: number
  sessionCalls: number
  sessionRefusals: number
  x402Payments: number
  /** Bodies seen by POST /paid under a session. */
  postedBodies: string[]
  /** `method` of each accepted payment POST. */
  methods: string[]
  errors: string[]
}

export interface MppMerchant {
  url: string
  stats: MppMerchantStats
  /** Forget every session (the next session call is refused). */
  revokeSessions(): void
  close(): Promise<void>
}

/** A fake card processor: `POST /tokens` issues `tok_…` per idempotency key; merchants redeem them in-process. */
export interface FakeCardProvider {
  url: string
  issued: Map<string, { token: string; amount: { value: string; currency: string }; merchant: string }>
  requests: number
  /** Answer the next N token requests 500. */
  failNext: number
  redeem(token: string): boolean
  close(): Promise<void>
}

const readAll = async (req: IncomingMessage): Promise<Buffer> => {
  const chunks: Buffer[] = []
  for await (const c of req) chunks.push(c as Buffer)
  return Buffer.concat(chunks)
}
const sendJson = (res: ServerResponse, status: number, v: unknown, headers: Record<string, string> = {}): void => {
  const body = Buffer.from(JSON.stringify(v))
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(body.length), ...headers })
  res.end(body)
}

export async function startFakeCardProvider(opts: { key?: string } = {}): Promise<FakeCardProvider> {
  const issued = new Map<string, { token: string; amount: { value: string; currency: string }; merchant: string }>()
  const redeemed = new Set<string>()
  const valid = new Set<string>()
  const p = { requests: 0, failNext: 0 }
  const l = await listen(async (req, res) => {
    p.requests++
    if (p.failNext > 0) {
      p.failNext--
      return sendJson(res, 500, { error: 'processor_down' })
    }
    const body = JSON.parse((await readAll(req)).toString() || '{}')
    if (req.method !== 'POST' || req.url !== '/tokens') return sendJson(res, 404, { error: 'not_found' })
    if (opts.key && req.headers.authorization !== `Bearer ${opts.key}`) return sendJson(res, 401, { error: 'unauthorized' })
    const key = String(body.idempotencyKey ?? req.headers['idempotency-key'] ?? '')
    let rec = issued.get(key)
    if (!rec) {
      rec = { token: `tok_${randomBytes(12).toString('hex')}`, amount: body.amount, merchant: body.merchant }
      issued.set(key, rec)
      valid.add(rec.token)
    }
    sendJson(res, 201, { token: rec.token, expiresAt: Date.now() + 600_000 })
  })
  return {
    url: `${l.url}/tokens`,
    issued,
    get requests() {
      return p.requests
    },
    set requests(n: number) {
      p.requests = n
    },
    get failNext() {
      return p.failNext
    },
    set failNext(n: number) {
      p.failNext = n
    },
    redeem(token: string): boolean {
      if (!valid.has(token) || redeemed.has(token)) return false
      redeemed.add(token)
      return true
    },
    close: () => l.close(),
  }
}

/** Written out here on purpose: the merchant verifies independently of Paygate's own MPP code. */
const INTENT_TYPES = {
  PaymentIntent: [
    { name: 'payer', type: 'address' },
    { name: 'amount', type: 'uint256' },
    { name: 'currency', type: 'string' },
    { name: 'resource', type: 'string' },
    { name: 'nonce', type: 'bytes32' },
    { name: 'expiry', type: 'uint256' },
  ],
} as const

class Refusal extends Error {}
const refuse = (why: string): never => {
  throw new Refusal(why)
}

export async function startMppMerchant(opts: MppMerchantOptions): Promise<MppMerchant> {
  const stats: MppMerchantStats = {
    challenges: 0,
    paymentPosts: 0,
    payments: 0,
    settlements: 0,
    intents: 0,
    cardCharges: 0,
    sessionCalls: 0,
    sessionRefusals: 0,
    x402Payments: 0,
    postedBodies: [],
    methods: [],
    errors: [],
  }
  const currency = opts.currency ?? 'USD'
  const units = parseUnits(opts.price, 6)
  const token = getAddress(opts.chain.token)
  const { account, publicClient, walletClient } = clientsFor(opts.chain, opts.facilitatorKey)
  const domain = { name: 'USD Coin', version: '2', chainId: opts.chain.chainId, verifyingContract: token } as const
  const sessions = new Map<string, number>()
  /** Accepted proofs (nonce or card token) -> the session they bought. */
  const accepted = new Map<string, string>()
  let failLeft = opts.failPaymentsFirst ?? 0
  let base = ''

  const challengeBody = () =>
    opts.rawBody ?? {
      protocol: 'mpp/1.0',
      amount: { value: opts.price, currency },
      paymentMethods: opts.methods,
      sessionSupported: opts.sessionSupported ?? true,
      paymentEndpoint: '/mpp/pay',
      ...(opts.payTo ? { payTo: opts.payTo } : {}),
      ...(opts.network !== null ? { network: opts.network ?? `eip155:${opts.chain.chainId}` } : {}),
      ...(opts.token !== null ? { token: opts.token ?? token } : {}),
      ...(opts.sessionTtlSeconds ? { sessionTtlSeconds: opts.sessionTtlSeconds } : {}),
    }
  const v2Entry = () => ({
    scheme: 'exact',
    network: `eip155:${opts.chain.chainId}`,
    amount: units.toString(),
    asset: token,
    payTo: opts.payTo,
    maxTimeoutSeconds: 120,
    extra: { name: 'USD Coin', version: '2' },
  })
  const challenge = (res: ServerResponse, path: string): void => {
    stats.challenges++
    const headers: Record<string, string> = {}
    if (opts.x402) {
      const required = { x402Version: 2, error: 'payment required', resource: { url: `${base}${path}`, description: 'paid thing', mimeType: 'application/json' }, accepts: [v2Entry()] }
      headers['payment-required'] = Buffer.from(JSON.stringify(required)).toString('base64')
    }
    sendJson(res, 402, challengeBody(), headers)
  }

  /** Verify an EIP-3009 authorization by recovery and settle it on chain (check-then-send under one queue). */
  async function settle3009(a: { from: Address; to: Address; value: bigint; validAfter: bigint; validBefore: bigint; nonce: Hex; signature: Hex }): Promise<Hex> {
    if (!opts.payTo || getAddress(a.to) !== getAddress(opts.payTo)) refuse('recipient_mismatch')
    if (a.value !== units) refuse(`amount_mismatch: ${a.value} != ${units}`)
    const signer = await recoverTypedDataAddress({ domain, types: TRANSFER_TYPES, primaryType: 'TransferWithAuthorization', message: a, signature: a.signature }).catch(() => null)
    if (!signer || signer !== getAddress(a.from)) refuse('invalid_signature')
    return serialSend(opts.chain.rpcUrl, account.address, async () => {
      const used = await publicClient.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'authorizationState', args: [a.from, a.nonce] })
      if (used) refuse('authorization_already_used')
      const hash = await walletClient.writeContract({
        address: token,
        abi: paygateUsdcAbi,
        functionName: 'transferWithAuthorization',
        args: [a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, a.signature],
      })
      const receipt = await publicClient.waitForTransactionReceipt({ hash, timeout: RECEIPT_TIMEOUT_MS, pollingInterval: POLL_MS })
      if (receipt.status !== 'success') refuse(`settlement_reverted: ${hash}`)
      stats.settlements++
      return hash
    })
  }

  const newSession = (): string => {
    const t = `sess_${randomBytes(16).toString('hex')}`
    sessions.set(t, Date.now() + (opts.sessionHeaderTtl ?? opts.sessionTtlSeconds ?? 3600) * 1000)
    return t
  }
  const sessionValid = (t: string | undefined): boolean => t !== undefined && (sessions.get(t) ?? 0) > Date.now()

  async function pay(req: IncomingMessage, res: ServerResponse): Promise<void> {
    stats.paymentPosts++
    if (failLeft > 0) {
      failLeft--
      return sendJson(res, 503, { error: 'unavailable' })
    }
    const b = JSON.parse((await readAll(req)).toString())
    if (!opts.methods.includes(b.method)) refuse(`method_not_offered: ${b.method}`)
    if (JSON.stringify(b.amount) !== JSON.stringify({ value: opts.price, currency })) refuse(`amount_not_echoed: ${JSON.stringify(b.amount)}`)
    const a = b.authorization ?? {}
    let proofKey: string
    let settlement: Hex | null = null
    if (a.type === 'eip3009') {
      if (a.network !== `eip155:${opts.chain.chainId}` || getAddress(a.token) !== token) refuse('wrong_chain_or_token')
      proofKey = `3009:${a.from}:${a.nonce}`
      if (!accepted.has(proofKey)) {
        settlement = await settle3009({ from: a.from, to: a.to, value: BigInt(a.value), validAfter: BigInt(a.validAfter), validBefore: BigInt(a.validBefore), nonce: a.nonce, signature: a.signature })
      }
    } else if (a.type === 'eip712-intent') {
      if (opts.payTo) refuse('payTo_named: an EIP-3009 authorization is required')
      if (BigInt(a.amount) !== (opts.expectUnits ?? units) || a.resource !== b.resource || a.chainId !== opts.chain.chainId) refuse('intent_terms_mismatch')
      if (BigInt(a.expiry) * 1000n < BigInt(Date.now())) refuse('intent_expired')
      const message = { payer: a.payer, amount: BigInt(a.amount), currency: a.currency, resource: a.resource, nonce: a.nonce, expiry: BigInt(a.expiry) }
      const signer = await recoverTypedDataAddress({
        domain: { name: 'Paygate MPP', version: '1', chainId: opts.chain.chainId },
        types: INTENT_TYPES,
        primaryType: 'PaymentIntent',
        message,
        signature: a.signature,
      }).catch(() => null)
      if (!signer || signer !== getAddress(a.payer)) refuse('invalid_signature')
      proofKey = `intent:${a.nonce}`
      if (!accepted.has(proofKey)) stats.intents++
    } else if (a.type === 'card') {
      proofKey = `card:${a.token}`
      if (!accepted.has(proofKey)) {
        if (!opts.card?.redeem(a.token)) refuse('card_token_invalid')
        stats.cardCharges++
      }
    } else if (a.type === 'lightning' && opts.lightning) {
      proofKey = `ln:${a.preimage}`
      if (!accepted.has(proofKey) && !opts.lightning(String(a.preimage))) refuse('lightning_preimage_invalid')
    } else {
      return refuse(`unsupported_authorization: ${a.type}`)
    }
    let session = accepted.get(proofKey)
    if (!session) {
      session = newSession()
      accepted.set(proofKey, session)
      stats.payments++
      stats.methods.push(b.method)
    }
    const headers: Record<string, string> = { 'x-mpp-session': session }
    if (opts.sessionHeaderTtl) headers['x-mpp-session-expires'] = String(opts.sessionHeaderTtl)
    if (settlement) headers['x-payment-response'] = Buffer.from(JSON.stringify({ success: true, transaction: settlement, network: `eip155:${opts.chain.chainId}`, payer: a.from })).toString('base64')
    sendJson(res, 200, { ok: true, paid: 'mpp', method: b.method }, headers)
  }

  async function payX402(header: string): Promise<boolean> {
    const p = JSON.parse(Buffer.from(header, 'base64').toString())
    const auth = p.payload.authorization
    if (JSON.stringify(p.accepted) !== JSON.stringify(v2Entry())) refuse('accepted_mismatch')
    await settle3009({
      from: auth.from,
      to: auth.to,
      value: BigInt(auth.value),
      validAfter: BigInt(auth.validAfter),
      validBefore: BigInt(auth.validBefore),
      nonce: auth.nonce,
      signature: p.payload.signature,
    })
    stats.x402Payments++
    return true
  }

  const l = await listen(async (req, res) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname
    try {
      if (path === '/free') return sendJson(res, 200, { ok: true, free: true })
      if (path === '/mpp/pay' && req.method === 'POST') return await pay(req, res)
      if (path !== '/paid') return sendJson(res, 404, { error: 'not_found' })
      const session = req.headers['x-mpp-session'] as string | undefined
      let served = false
      if (session !== undefined) {
        if (sessionValid(session)) {
          stats.sessionCalls++
          served = true
        } else {
          stats.sessionRefusals++
          if (opts.refuseSessionWith === 401) return sendJson(res, 401, { error: 'session_invalid' })
          return challenge(res, path)
        }
      }
      const sig = req.headers['payment-signature'] as string | undefined
      if (!served && opts.x402 && sig) served = await payX402(sig)
      if (!served) return challenge(res, path)
      if (req.method === 'POST') {
        const body = await readAll(req)
        stats.postedBodies.push(body.toString())
        res.writeHead(200, { 'content-type': req.headers['content-type'] ?? 'application/octet-stream', 'content-length': String(body.length) })
        return res.end(body)
      }
      return sendJson(res, 200, { ok: true, paid: 'mpp' })
    } catch (e) {
      const why = e instanceof Refusal ? e.message : `error: ${(e as Error).message}`
      stats.errors.push(why)
      if (!res.headersSent) sendJson(res, e instanceof Refusal ? 402 : 500, { error: why })
    }
  })
  base = l.url
  return {
    url: l.url,
    stats,
    revokeSessions: () => sessions.clear(),
    close: () => l.close(),
  }
}
