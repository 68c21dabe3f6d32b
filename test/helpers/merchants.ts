/**
 * Real x402 merchants for tests. Each one is an HTTP server on 127.0.0.1 (port 0) that
 * answers `402` until paid, then settles FOR REAL on a local EVM chain with the token's
 * EIP-3009 `transferWithAuthorization`, sent from `facilitatorKey` (which pays the gas;
 * fund it with `anvil_setBalance` / `hardhat_setBalance` first).
 *
 * - `startV2Merchant`: the official `@x402/express` v2 `paymentMiddleware` with the
 *   official in-process facilitator (`x402Facilitator` + `@x402/evm` exact), network
 *   `eip155:<chainId>`, asset = the token with `extra: {name: 'USD Coin', version: '2'}`.
 * - `startV1Merchant`: the official `x402-express` v1 `paymentMiddleware`, network
 *   `base-sepolia` (the chain MUST have chain id 84532), paying through an HTTP
 *   facilitator that this helper serves on a second loopback port (`POST /verify`,
 *   `POST /settle`, `GET /supported`, built on `x402/facilitator`'s verify/settle).
 * - `startSpecMerchant`: our own merchant for the spec's two 402 shapes (`simple`:
 *   `{scheme, network, token, amount, payTo, resource}`; `accepts`: `{accepts:[{scheme,
 *   network, maxAmountRequired, resource, description, mimeType, payToAddress,
 *   requiredDeadlineSeconds, asset, extra}]}`), paid with `X-PAYMENT` (base64 JSON
 *   `{scheme, network, payload:{from,to,amount,token,nonce,validAfter,validBefore},
 *   signature}`) + `X-PAYMENT-SIGNATURE`. It checks the terms, recovers the EIP-712
 *   signer, refuses used nonces, settles, waits for the receipt and answers 200 with
 *   `X-PAYMENT-RESPONSE: base64({success, transaction, network, payer})`. A bad proof
 *   gets the 402 challenge again with an `error` field.
 *
 * Routes on every merchant: `GET /paid` -> `{ok: true, paid: 'v2' | 'v1' | 'spec'}`;
 * `POST /paid` (paid) -> the request body echoed byte for byte with the request's
 * content type; `GET /free` -> `{ok: true, free: true}` without payment.
 * `url` is the base (`http://127.0.0.1:<port>`), not a route.
 *
 * Fault injection (all three merchants; `faults` at start, or `setFaults()` later, which
 * also resets the "once"/count budgets). On the official merchants a middleware placed
 * BEFORE the official one wraps `res.end`; the official middleware buffers the handler's
 * answer, settles, then calls that wrapped `end`, so the wrapper acts after settlement.
 *
 *   failSettleOnce: true | 'after-settle'
 *       The first settled paid response is not sent: the connection is destroyed after
 *       the money moved (client sees a socket error; the payment DID happen).
 *   failSettleOnce: 'before-settle'
 *       The first request carrying a payment header gets its connection destroyed
 *       before verification/settlement: no money moves; the same payment can be sent
 *       again and will succeed.
 *   hangOnceMs: n
 *       The first settled paid response is held n ms before being sent (put n past the
 *       client's timeout: the client gives up while the money moved).
 *   error500AfterPayment: true | n
 *       Settle, then answer 500 `{error:'internal_error'}` (every paid request, or the
 *       first n). The settlement header IS kept (the merchant reports the payment).
 *   again402AfterPayment: true | n
 *       Settle, then answer the unpaid 402 challenge again, without a settlement header,
 *       as if the payment had not been seen (every paid request, or the first n).
 *
 * When several apply to one response: failSettleOnce, then hangOnceMs, then
 * error500AfterPayment, then again402AfterPayment (only the first applies).
 */
import http from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import { once } from 'node:events'
import express, { type Request, type RequestHandler, type Response } from 'express'
import {
  createPublicClient,
  createWalletClient,
  defineChain,
  getAddress,
  http as viemHttp,
  isAddress,
  parseSignature,
  publicActions,
  recoverTypedDataAddress,
  type Chain,
  type Hex,
  type PublicClient,
} from 'viem'
import { privateKeyToAccount, type PrivateKeyAccount } from 'viem/accounts'
import { x402Facilitator } from '@x402/core/facilitator'
import { x402HTTPResourceServer, x402ResourceServer, type FacilitatorClient } from '@x402/core/server'
import type { PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse } from '@x402/core/types'
import { paymentMiddlewareFromHTTPServer } from '@x402/express'
import { toFacilitatorEvmSigner } from '@x402/evm'
import { registerExactEvmScheme } from '@x402/evm/exact/facilitator'
import { ExactEvmScheme as ExactEvmServerScheme } from '@x402/evm/exact/server'
import { paymentMiddleware as paymentMiddlewareV1 } from 'x402-express'
import { settle as settleV1, verify as verifyV1 } from 'x402/facilitator'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'

export type Address = `0x${string}`

export interface LocalChain {
  rpcUrl: string
  chainId: number
  /** The EIP-3009 token (PaygateUSDC: "USD Coin", version "2"). */
  token: Address
}

export interface MerchantFaults {
  failSettleOnce?: boolean | 'after-settle' | 'before-settle'
  hangOnceMs?: number
  error500AfterPayment?: boolean | number
  again402AfterPayment?: boolean | number
}

export interface MerchantOptions {
  chain: LocalChain
  /** Pays the gas of settlement; must hold native balance. */
  facilitatorKey: Hex
  payTo: Address
  /** Price in base units of the token. */
  price: bigint
  /** Offered authorization lifetime (x402 `maxTimeoutSeconds`). Default 120. */
  maxTimeoutSeconds?: number
  faults?: MerchantFaults
}

export interface SpecMerchantOptions extends MerchantOptions {
  shape: 'simple' | 'accepts'
  /** Network string offered and required. Default `eip155:<chainId>`. */
  network?: string
  /** Which `transferWithAuthorization` overload settles. Default `bytes`. */
  signatureForm?: 'bytes' | 'vrs'
}

export interface MerchantStats {
  /** Every request (internal ones excluded). */
  requests: number
  /** 402 challenges sent to requests without a payment. */
  challenges: number
  /** Requests that carried a payment header. */
  paidAttempts: number
  /** Facilitator verify calls (spec merchant: proofs that reached signature recovery). */
  verifyCalls: number
  /** Facilitator settle calls (spec merchant: on-chain settlement attempts). */
  settleCalls: number
  /** Successful on-chain settlements. */
  settlements: number
  /** Paid requests answered 402 because the payment was refused (bad proof, replay, settle failure). */
  rejected: number
  /** Paid requests answered 2xx with the resource. */
  paidServed: number
  /** Faults actually injected. */
  faultsInjected: number
  /** Transaction hashes of successful settlements, in order. */
  transactions: Hex[]
  /** Reasons of refused payments, in order. */
  errors: string[]
}

export interface Merchant {
  kind: 'v2' | 'v1' | 'spec-simple' | 'spec-accepts'
  /** Base URL, e.g. `http://127.0.0.1:40123` (routes: `/paid`, `/free`). */
  url: string
  /** The network string this merchant offers. */
  network: string
  stats: MerchantStats
  /** The live fault settings (read-only view; change them with setFaults). */
  readonly faults: MerchantFaults
  /** Replace the fault settings and reset their once/count budgets. */
  setFaults(faults: MerchantFaults): void
  /** v1 only: the helper's HTTP facilitator base URL. */
  facilitatorUrl?: string
  close(): Promise<void>
}

// ---------------------------------------------------------------------------
// chain plumbing

export const RECEIPT_TIMEOUT_MS = 30_000
export const POLL_MS = 25
const TOKEN_DOMAIN = { name: 'USD Coin', version: '2' } as const
const INTERNAL_HEADER = 'x-merchant-internal'

function chainOf(c: LocalChain): Chain {
  return defineChain({
    id: c.chainId,
    name: `local-${c.chainId}`,
    nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: [c.rpcUrl] } },
  })
}

/**
 * A `PAYMENT-RESPONSE` value reporting a settlement that was never made, for bare test targets
 * whose tests are about something else (offers, signing): Paygate counts a paid answer as
 * settled when the target reports it, else it checks the chain and holds the payment.
 */
export const reportedSettlement = (chainId: number): string =>
  Buffer.from(JSON.stringify({ success: true, transaction: `0x${'ab'.repeat(32)}`, network: `eip155:${chainId}`, payer: null })).toString('base64')

export function clientsFor(c: LocalChain, key: Hex) {
  const chain = chainOf(c)
  const transport = viemHttp(c.rpcUrl, { batch: false, retryCount: 1, timeout: 20_000 })
  const account = privateKeyToAccount(key)
  const publicClient = createPublicClient({ chain, transport, pollingInterval: POLL_MS }) as PublicClient
  const walletClient = createWalletClient({ chain, transport, account, pollingInterval: POLL_MS }).extend(publicActions)
  return { chain, account, publicClient, walletClient }
}

/**
 * One transaction at a time per (chain, sender) in this process, held until its receipt:
 * several merchants may share one facilitator key, and automining chains reject nonce gaps.
 */
const sendQueues = new Map<string, Promise<unknown>>()
export function serialSend<T>(rpcUrl: string, from: Address, work: () => Promise<T>): Promise<T> {
  const key = `${rpcUrl}|${from.toLowerCase()}`
  const prev = sendQueues.get(key) ?? Promise.resolve()
  const run = prev.then(work, work)
  const tail = run.catch(() => undefined)
  sendQueues.set(key, tail)
  void tail.then(() => {
    if (sendQueues.get(key) === tail) sendQueues.delete(key)
  })
  return run
}

/** writeContract that returns only once the transaction is mined (successfully or not). */
function minedWrite(rpcUrl: string, account: PrivateKeyAccount, publicClient: PublicClient, send: () => Promise<Hex>): Promise<Hex> {
  return serialSend(rpcUrl, account.address, async () => {
    const hash = await send()
    await publicClient.waitForTransactionReceipt({ hash, timeout: RECEIPT_TIMEOUT_MS, pollingInterval: POLL_MS })
    return hash
  })
}

// ---------------------------------------------------------------------------
// servers, stats, faults

const newStats = (): MerchantStats => ({
  requests: 0,
  challenges: 0,
  paidAttempts: 0,
  verifyCalls: 0,
  settleCalls: 0,
  settlements: 0,
  rejected: 0,
  paidServed: 0,
  faultsInjected: 0,
  transactions: [],
  errors: [],
})

type AfterSettleFault = { kind: 'destroy' } | { kind: 'hang'; ms: number } | { kind: 'error500' } | { kind: 'again402' }

class FaultState {
  faults: MerchantFaults = {}
  private used = { failSettle: 0, hang: 0, error500: 0, again402: 0 }

  constructor(
    faults: MerchantFaults | undefined,
    private readonly stats: MerchantStats,
  ) {
    this.set(faults ?? {})
  }

  set(faults: MerchantFaults): void {
    this.faults = { ...faults }
    this.used = { failSettle: 0, hang: 0, error500: 0, again402: 0 }
  }

  private static budget(v: boolean | number | undefined): number {
    if (v === true) return Number.POSITIVE_INFINITY
    if (typeof v === 'number' && v > 0) return v
    return 0
  }

  /** Should this paid request's connection be destroyed before anything else happens? */
  beforeSettle(): boolean {
    if (this.faults.failSettleOnce === 'before-settle' && this.used.failSettle === 0) {
      this.used.failSettle++
      this.stats.faultsInjected++
      return true
    }
    return false
  }

  /** The fault to apply to a paid response whose payment has been settled, if any. */
  afterSettle(): AfterSettleFault | null {
    const f = this.faults
    let out: AfterSettleFault | null = null
    if ((f.failSettleOnce === true || f.failSettleOnce === 'after-settle') && this.used.failSettle === 0) {
      this.used.failSettle++
      out = { kind: 'destroy' }
    } else if (f.hangOnceMs !== undefined && f.hangOnceMs > 0 && this.used.hang === 0) {
      this.used.hang++
      out = { kind: 'hang', ms: f.hangOnceMs }
    } else if (this.used.error500 < FaultState.budget(f.error500AfterPayment)) {
      this.used.error500++
      out = { kind: 'error500' }
    } else if (this.used.again402 < FaultState.budget(f.again402AfterPayment)) {
      this.used.again402++
      out = { kind: 'again402' }
    }
    if (out) this.stats.faultsInjected++
    return out
  }
}

export interface Listening {
  url: string
  close(): Promise<void>
  /** Timers to clear on close (held responses). */
  timers: Set<NodeJS.Timeout>
}

export async function listen(app: http.RequestListener, timers = new Set<NodeJS.Timeout>()): Promise<Listening> {
  const server = http.createServer(app)
  const sockets = new Set<Socket>()
  server.on('connection', (s) => {
    sockets.add(s)
    s.on('close', () => sockets.delete(s))
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const { port } = server.address() as AddressInfo
  let closed: Promise<void> | null = null
  return {
    url: `http://127.0.0.1:${port}`,
    timers,
    close() {
      closed ??= new Promise<void>((resolve) => {
        for (const t of timers) clearTimeout(t)
        timers.clear()
        const done = setTimeout(resolve, 2_000)
        server.close(() => {
          clearTimeout(done)
          resolve()
        })
        for (const s of sockets) s.destroy()
        server.closeAllConnections()
      })
      return closed
    },
  }
}

const jsonBody = (v: unknown): Buffer => Buffer.from(JSON.stringify(v), 'utf8')

function addRoutes(app: express.Express, label: string): void {
  app.get('/free', (_req, res) => {
    res.json({ ok: true, free: true })
  })
  // `?status=404` (any 4xx): the route's own answer after a valid payment; the official
  // middlewares then do not settle.
  app.get('/paid', (req, res) => {
    const status = Number(req.query.status ?? 200)
    if (status >= 400) res.status(status).json({ error: 'route answered', status })
    else res.json({ ok: true, paid: label })
  })
  app.post('/paid', express.raw({ type: () => true, limit: '5mb' }), (req, res) => {
    const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0)
    res
      .status(200)
      .type(req.get('content-type') ?? 'application/json')
      .send(body)
  })
}

const hasHeader = (req: Request, name: string): boolean => {
  const v = req.headers[name]
  return typeof v === 'string' ? v.trim() !== '' : Array.isArray(v) && v.length > 0
}

type EndArgs = Parameters<Response['end']>

/**
 * The fault layer in front of an official payment middleware: counts, remembers the
 * last 402 challenge per route, and rewrites or drops the response after settlement.
 */
function officialFaultLayer(opts: {
  stats: MerchantStats
  faults: FaultState
  paymentHeaders: string[]
  settlementHeader: string
  timers: Set<NodeJS.Timeout>
  selfUrl: () => string
}): RequestHandler {
  const { stats, faults, settlementHeader, timers } = opts
  const challenges = new Map<string, { headers: Record<string, string>; body: Buffer }>()

  const captureEnd = (res: Response, key: string, realEnd: Response['end']) =>
    function (this: Response, ...args: EndArgs) {
      if (res.statusCode === 402) {
        stats.challenges++
        const headers: Record<string, string> = {}
        const pr = res.getHeader('payment-required')
        if (pr !== undefined) headers['payment-required'] = String(pr)
        const chunk = args[0]
        const body = typeof chunk === 'string' || Buffer.isBuffer(chunk) ? Buffer.from(chunk) : Buffer.alloc(0)
        challenges.set(key, { headers, body })
      }
      return (realEnd as (...a: EndArgs) => Response).apply(res, args)
    } as Response['end']

  async function challengeFor(req: Request): Promise<{ headers: Record<string, string>; body: Buffer }> {
    const key = `${req.method} ${req.path}`
    const known = challenges.get(key)
    if (known) return known
    const r = await fetch(opts.selfUrl() + req.originalUrl, {
      method: req.method,
      headers: { [INTERNAL_HEADER]: '1', accept: 'application/json' },
      signal: AbortSignal.timeout(10_000),
    })
    const headers: Record<string, string> = {}
    const pr = r.headers.get('payment-required')
    if (pr !== null) headers['payment-required'] = pr
    return { headers, body: Buffer.from(await r.arrayBuffer()) }
  }

  return (req, res, next) => {
    const internal = hasHeader(req, INTERNAL_HEADER)
    if (!internal) stats.requests++
    const paid = opts.paymentHeaders.some((h) => hasHeader(req, h))
    const realEnd = res.end.bind(res) as Response['end']
    if (!paid) {
      if (!internal) res.end = captureEnd(res, `${req.method} ${req.path}`, realEnd)
      return next()
    }
    stats.paidAttempts++
    if (faults.beforeSettle()) {
      req.socket.destroy()
      return
    }
    res.end = function (this: Response, ...args: EndArgs) {
      const end = () => (realEnd as (...a: EndArgs) => Response).apply(res, args)
      const settled = res.getHeader(settlementHeader) !== undefined
      if (!settled || res.statusCode >= 400) {
        if (res.statusCode === 402) stats.rejected++
        return end()
      }
      const fault = faults.afterSettle()
      if (fault === null) {
        stats.paidServed++
        return end()
      }
      switch (fault.kind) {
        case 'destroy':
          req.socket.destroy()
          return res
        case 'hang': {
          const t = setTimeout(() => {
            timers.delete(t)
            if (res.destroyed || req.socket.destroyed) return
            stats.paidServed++
            end()
          }, fault.ms)
          timers.add(t)
          return res
        }
        case 'error500': {
          const body = jsonBody({ error: 'internal_error', detail: 'injected fault: 500 after payment' })
          res.statusCode = 500
          res.removeHeader('etag')
          res.setHeader('content-type', 'application/json; charset=utf-8')
          res.setHeader('content-length', body.length)
          return (realEnd as (chunk: Buffer) => Response)(body)
        }
        case 'again402': {
          void challengeFor(req).then(
            (c) => {
              res.statusCode = 402
              res.removeHeader(settlementHeader)
              res.removeHeader('etag')
              for (const [k, v] of Object.entries(c.headers)) res.setHeader(k, v)
              res.setHeader('content-type', 'application/json; charset=utf-8')
              res.setHeader('content-length', c.body.length)
              ;(realEnd as (chunk: Buffer) => Response)(c.body)
            },
            () => req.socket.destroy(),
          )
          return res
        }
      }
    } as Response['end']
    next()
  }
}

// ---------------------------------------------------------------------------
// v2: @x402/express + in-process facilitator

export async function startV2Merchant(opts: MerchantOptions): Promise<Merchant> {
  const stats = newStats()
  const faults = new FaultState(opts.faults, stats)
  const network = `eip155:${opts.chain.chainId}` as const
  const { account, publicClient, walletClient } = clientsFor(opts.chain, opts.facilitatorKey)

  const signer = toFacilitatorEvmSigner(
    {
      address: account.address,
      readContract: (args) => publicClient.readContract(args as never),
      verifyTypedData: (args) => publicClient.verifyTypedData(args as never),
      writeContract: (args) => minedWrite(opts.chain.rpcUrl, account, publicClient, () => walletClient.writeContract({ ...args, account, chain: walletClient.chain } as never)),
      sendTransaction: (args) => minedWrite(opts.chain.rpcUrl, account, publicClient, () => walletClient.sendTransaction({ ...args, account, chain: walletClient.chain })),
      waitForTransactionReceipt: (args) => publicClient.waitForTransactionReceipt({ hash: args.hash, timeout: args.timeout ?? RECEIPT_TIMEOUT_MS, pollingInterval: POLL_MS }),
      getCode: (args) => publicClient.getCode(args),
    },
    { confirmationTimeoutMs: RECEIPT_TIMEOUT_MS },
  )
  const facilitator = new x402Facilitator()
  registerExactEvmScheme(facilitator, { signer, networks: network })
  // The resource server talks to the in-process facilitator through this counting client.
  const client: FacilitatorClient = {
    async verify(p: PaymentPayload, r: PaymentRequirements): Promise<VerifyResponse> {
      stats.verifyCalls++
      const out = await facilitator.verify(p, r)
      if (!out.isValid) stats.errors.push(String(out.invalidReason ?? 'invalid'))
      return out
    },
    async settle(p: PaymentPayload, r: PaymentRequirements): Promise<SettleResponse> {
      stats.settleCalls++
      const out = await facilitator.settle(p, r)
      if (out.success) {
        stats.settlements++
        stats.transactions.push(out.transaction as Hex)
      } else stats.errors.push(String(out.errorReason ?? 'settle failed'))
      return out
    },
    async getSupported() {
      return facilitator.getSupported() as never
    },
  }
  const resourceServer = new x402ResourceServer(client).register(network, new ExactEvmServerScheme())
  const accepts = {
    scheme: 'exact',
    network,
    payTo: getAddress(opts.payTo),
    price: { amount: opts.price.toString(), asset: getAddress(opts.chain.token), extra: { ...TOKEN_DOMAIN } },
    maxTimeoutSeconds: opts.maxTimeoutSeconds ?? 120,
  }
  const httpServer = new x402HTTPResourceServer(resourceServer, {
    'GET /paid': { accepts, description: 'paid thing (v2)', mimeType: 'application/json' },
    'POST /paid': { accepts, description: 'paid echo (v2)', mimeType: 'application/json' },
  })
  // Initialise here so that a misconfiguration rejects this promise (the middleware's own
  // start-up sync would call process.exit instead).
  await httpServer.initialize()

  const app = express()
  let base = ''
  const timers = new Set<NodeJS.Timeout>()
  app.use(
    officialFaultLayer({
      stats,
      faults,
      paymentHeaders: ['payment-signature', 'x-payment'],
      settlementHeader: 'payment-response',
      timers,
      selfUrl: () => base,
    }),
  )
  app.use(paymentMiddlewareFromHTTPServer(httpServer, undefined, undefined, false))
  addRoutes(app, 'v2')
  const server = await listen(app, timers)
  base = server.url
  return {
    kind: 'v2',
    url: server.url,
    network,
    stats,
    get faults() {
      return faults.faults
    },
    setFaults: (f) => faults.set(f),
    close: () => server.close(),
  }
}

// ---------------------------------------------------------------------------
// v1: x402-express + an HTTP facilitator on x402@1's verify/settle

export async function startV1Merchant(opts: MerchantOptions): Promise<Merchant> {
  if (opts.chain.chainId !== 84532) {
    throw new Error(`the v1 merchant offers network "base-sepolia": the chain must have chain id 84532, not ${opts.chain.chainId}`)
  }
  const stats = newStats()
  const faults = new FaultState(opts.faults, stats)
  const network = 'base-sepolia'
  const { account, publicClient, walletClient } = clientsFor(opts.chain, opts.facilitatorKey)
  // x402@1's settle() calls writeContract then waitForTransactionReceipt on this client.
  const settleWallet = {
    ...walletClient,
    writeContract: (args: Parameters<typeof walletClient.writeContract>[0]) => minedWrite(opts.chain.rpcUrl, account, publicClient, () => walletClient.writeContract(args)),
  }

  const fac = express()
  fac.use(express.json({ limit: '1mb' }))
  fac.post('/verify', async (req, res) => {
    stats.verifyCalls++
    const { paymentPayload, paymentRequirements } = (req.body ?? {}) as { paymentPayload?: unknown; paymentRequirements?: unknown }
    try {
      const out = await verifyV1(walletClient as never, paymentPayload as never, paymentRequirements as never)
      if (!out.isValid) stats.errors.push(String(out.invalidReason ?? 'invalid'))
      res.json(out)
    } catch (e) {
      stats.errors.push(`verify threw: ${(e as Error).message.split('\n')[0]}`)
      res.json({ isValid: false, invalidReason: 'unexpected_verify_error' })
    }
  })
  fac.post('/settle', async (req, res) => {
    stats.settleCalls++
    const { paymentPayload, paymentRequirements } = (req.body ?? {}) as { paymentPayload?: { network?: string }; paymentRequirements?: unknown }
    try {
      const out = await settleV1(settleWallet as never, paymentPayload as never, paymentRequirements as never)
      if (out.success) {
        stats.settlements++
        stats.transactions.push(out.transaction as Hex)
      } else stats.errors.push(String(out.errorReason ?? 'settle failed'))
      res.json(out)
    } catch (e) {
      // A revert (e.g. a replayed nonce) throws inside x402's settle: report it as a failed settlement.
      stats.errors.push(`settle threw: ${(e as Error).message.split('\n')[0]}`)
      res.json({ success: false, errorReason: 'unexpected_settle_error', transaction: '', network: paymentPayload?.network ?? network })
    }
  })
  fac.get('/supported', (_req, res) => {
    res.json({ kinds: [{ x402Version: 1, scheme: 'exact', network }] })
  })
  const facServer = await listen(fac)

  const price = {
    amount: opts.price.toString(),
    asset: { address: getAddress(opts.chain.token), decimals: 6, eip712: { ...TOKEN_DOMAIN } },
  }
  const config = { mimeType: 'application/json', maxTimeoutSeconds: opts.maxTimeoutSeconds ?? 120 }
  const app = express()
  let base = ''
  const timers = new Set<NodeJS.Timeout>()
  app.use(
    officialFaultLayer({
      stats,
      faults,
      paymentHeaders: ['x-payment'],
      settlementHeader: 'x-payment-response',
      timers,
      selfUrl: () => base,
    }),
  )
  app.use(
    paymentMiddlewareV1(
      getAddress(opts.payTo),
      {
        'GET /paid': { price, network, config: { ...config, description: 'paid thing (v1)' } },
        'POST /paid': { price, network, config: { ...config, description: 'paid echo (v1)' } },
      },
      { url: facServer.url as `${string}://${string}` },
    ),
  )
  addRoutes(app, 'v1')
  let server: Listening
  try {
    server = await listen(app, timers)
  } catch (e) {
    await facServer.close()
    throw e
  }
  base = server.url
  return {
    kind: 'v1',
    url: server.url,
    network,
    facilitatorUrl: facServer.url,
    stats,
    get faults() {
      return faults.faults
    },
    setFaults: (f) => faults.set(f),
    async close() {
      await Promise.all([server.close(), facServer.close()])
    },
  }
}

// ---------------------------------------------------------------------------
// the spec's shapes, our own merchant

/** Written out here on purpose: the merchant verifies independently of Paygate's own x402 code. */
export const TRANSFER_TYPES = {
  TransferWithAuthorization: [
    { name: 'from', type: 'address' },
    { name: 'to', type: 'address' },
    { name: 'value', type: 'uint256' },
    { name: 'validAfter', type: 'uint256' },
    { name: 'validBefore', type: 'uint256' },
    { name: 'nonce', type: 'bytes32' },
  ],
} as const

class Refusal extends Error {}
const refuse = (reason: string): never => {
  throw new Refusal(reason)
}

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v)

function uintField(v: unknown, name: string): bigint {
  if (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) return BigInt(v)
  if (typeof v === 'string' && /^\d+$/.test(v.trim())) return BigInt(v.trim())
  return refuse(`invalid_payload: ${name} must be a decimal integer`)
}

function addressField(v: unknown, name: string): Address {
  if (typeof v !== 'string' || !isAddress(v, { strict: false })) return refuse(`invalid_payload: ${name} must be an address`)
  return getAddress(v)
}

interface SpecProof {
  scheme: string
  network: string
  from: Address
  to: Address
  amount: bigint
  token: Address
  nonce: Hex
  validAfter: bigint
  validBefore: bigint
  signature: Hex
}

/** Decode `X-PAYMENT` (+ `X-PAYMENT-SIGNATURE`) in the spec's payload shape. */
function decodeSpecProof(header: string, signatureHeader: string | undefined): SpecProof {
  let obj: unknown
  try {
    obj = JSON.parse(Buffer.from(header.trim(), 'base64').toString('utf8'))
  } catch {
    return refuse('invalid_payment_header: X-PAYMENT is not base64 of JSON')
  }
  if (!isObj(obj) || !isObj(obj.payload)) return refuse('invalid_payment_header: no payload object')
  const p = obj.payload
  const auth = isObj(p.authorization) ? p.authorization : {}
  const sigs = [signatureHeader?.trim(), obj.signature, p.signature].filter((s): s is string => typeof s === 'string' && s !== '')
  const signature = sigs[0]
  if (signature === undefined) return refuse('missing_signature: send X-PAYMENT-SIGNATURE')
  if (!/^0x[0-9a-fA-F]+$/.test(signature)) return refuse('invalid_signature: not hex')
  if (sigs.some((s) => s.toLowerCase() !== signature.toLowerCase())) return refuse("invalid_signature: X-PAYMENT-SIGNATURE differs from the payload's signature")
  const nonce = p.nonce ?? auth.nonce
  if (typeof nonce !== 'string' || !/^0x[0-9a-fA-F]{64}$/.test(nonce)) return refuse('invalid_payload: nonce must be 32 bytes of hex')
  return {
    scheme: typeof obj.scheme === 'string' ? obj.scheme : '',
    network: typeof obj.network === 'string' ? obj.network : '',
    from: addressField(p.from ?? auth.from, 'from'),
    to: addressField(p.to ?? auth.to, 'to'),
    amount: uintField(p.amount ?? auth.value, 'amount'),
    token: addressField(p.token ?? p.asset, 'token'),
    nonce: nonce as Hex,
    validAfter: uintField(p.validAfter ?? auth.validAfter ?? 0, 'validAfter'),
    validBefore: uintField(p.validBefore ?? auth.validBefore, 'validBefore'),
    signature: signature as Hex,
  }
}

export async function startSpecMerchant(opts: SpecMerchantOptions): Promise<Merchant> {
  const stats = newStats()
  const faults = new FaultState(opts.faults, stats)
  const network = opts.network ?? `eip155:${opts.chain.chainId}`
  const token = getAddress(opts.chain.token)
  const payTo = getAddress(opts.payTo)
  const deadline = opts.maxTimeoutSeconds ?? 120
  const form = opts.signatureForm ?? 'bytes'
  const { account, publicClient, walletClient } = clientsFor(opts.chain, opts.facilitatorKey)
  // The EIP-712 domain as the token itself reports it.
  const [name, version] = await Promise.all([
    publicClient.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'name' }),
    publicClient.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'version' }),
  ])
  const domain = { name, version, chainId: opts.chain.chainId, verifyingContract: token }
  let base = ''

  const challenge = (req: Request, error?: string): Record<string, unknown> => {
    const resource = `${base}${req.path}`
    const extra = error === undefined ? {} : { error }
    if (opts.shape === 'simple') {
      return { scheme: 'exact', network, token, amount: opts.price.toString(), payTo, resource, ...extra }
    }
    return {
      accepts: [
        {
          scheme: 'exact',
          network,
          maxAmountRequired: opts.price.toString(),
          resource,
          description: 'paid thing (spec)',
          mimeType: 'application/json',
          payToAddress: payTo,
          requiredDeadlineSeconds: deadline,
          asset: token,
          extra: { name, version },
        },
      ],
      ...extra,
    }
  }

  /** Verify and settle; resolves with the settlement or throws Refusal. */
  async function settle(proof: SpecProof): Promise<{ transaction: Hex; payer: Address }> {
    if (proof.scheme !== 'exact') refuse(`unsupported_scheme: ${proof.scheme}`)
    if (proof.network !== network) refuse(`network_mismatch: ${proof.network}`)
    if (proof.token !== token) refuse(`token_mismatch: ${proof.token}`)
    if (proof.to !== payTo) refuse(`recipient_mismatch: ${proof.to}`)
    if (proof.amount < opts.price) refuse(`insufficient_amount: ${proof.amount} < ${opts.price}`)
    const now = BigInt(Math.floor(Date.now() / 1000))
    if (proof.validBefore < now + 5n) refuse('authorization_expired')
    if (proof.validAfter > now) refuse('authorization_not_yet_valid')
    stats.verifyCalls++
    const message = {
      from: proof.from,
      to: proof.to,
      value: proof.amount,
      validAfter: proof.validAfter,
      validBefore: proof.validBefore,
      nonce: proof.nonce,
    }
    let signer: Address
    try {
      signer = await recoverTypedDataAddress({ domain, types: TRANSFER_TYPES, primaryType: 'TransferWithAuthorization', message, signature: proof.signature })
    } catch {
      return refuse('invalid_signature: cannot recover a signer')
    }
    if (signer !== proof.from) refuse('invalid_signature: signer is not payload.from')
    // Check-then-send under the sender's queue, so that two copies of one payment cannot both pass.
    return serialSend(opts.chain.rpcUrl, account.address, async () => {
      const used = await publicClient.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'authorizationState', args: [proof.from, proof.nonce] })
      if (used) refuse('authorization_already_used')
      const balance = await publicClient.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [proof.from] })
      if (balance < proof.amount) refuse('insufficient_funds')
      stats.settleCalls++
      const head = [proof.from, proof.to, proof.amount, proof.validAfter, proof.validBefore, proof.nonce] as const
      let hash: Hex
      try {
        if (form === 'bytes') {
          hash = await walletClient.writeContract({ address: token, abi: paygateUsdcAbi, functionName: 'transferWithAuthorization', args: [...head, proof.signature] })
        } else {
          const sig = parseSignature(proof.signature)
          const v = sig.v !== undefined ? Number(sig.v) : 27 + sig.yParity
          hash = await walletClient.writeContract({ address: token, abi: paygateUsdcAbi, functionName: 'transferWithAuthorization', args: [...head, v, sig.r, sig.s] })
        }
      } catch (e) {
        return refuse(`settlement_failed: ${(e as Error).message.split('\n')[0]}`)
      }
      const receipt = await publicClient.waitForTransactionReceipt({ hash, timeout: RECEIPT_TIMEOUT_MS, pollingInterval: POLL_MS })
      if (receipt.status !== 'success') refuse(`settlement_reverted: ${hash}`)
      stats.settlements++
      stats.transactions.push(hash)
      return { transaction: hash, payer: proof.from }
    })
  }

  const app = express()
  const timers = new Set<NodeJS.Timeout>()
  const paidRoute: RequestHandler = (req, res, next) => {
    stats.requests++
    if (req.path !== '/paid' || (req.method !== 'GET' && req.method !== 'POST')) return next()
    const header = req.get('x-payment')
    if (header === undefined || header.trim() === '') {
      stats.challenges++
      res.status(402).json(challenge(req))
      return
    }
    stats.paidAttempts++
    if (faults.beforeSettle()) {
      req.socket.destroy()
      return
    }
    let proof: SpecProof
    try {
      proof = decodeSpecProof(header, req.get('x-payment-signature'))
    } catch (e) {
      stats.rejected++
      stats.errors.push((e as Error).message)
      res.status(402).json(challenge(req, (e as Error).message))
      return
    }
    settle(proof).then(
      (s) => {
        const receiptHeader = Buffer.from(JSON.stringify({ success: true, transaction: s.transaction, network, payer: s.payer })).toString('base64')
        const fault = faults.afterSettle()
        if (fault?.kind === 'destroy') {
          req.socket.destroy()
          return
        }
        if (fault?.kind === 'again402') {
          res.status(402).json(challenge(req))
          return
        }
        res.setHeader('X-PAYMENT-RESPONSE', receiptHeader)
        res.setHeader('Access-Control-Expose-Headers', 'X-PAYMENT-RESPONSE')
        if (fault?.kind === 'error500') {
          res.status(500).json({ error: 'internal_error', detail: 'injected fault: 500 after payment' })
          return
        }
        const serve = () => {
          stats.paidServed++
          next()
        }
        if (fault?.kind === 'hang') {
          const t = setTimeout(() => {
            timers.delete(t)
            if (!req.socket.destroyed) serve()
          }, fault.ms)
          timers.add(t)
          return
        }
        serve()
      },
      (e: unknown) => {
        if (!(e instanceof Refusal)) console.error('spec merchant: unexpected error', e)
        const reason = e instanceof Error ? e.message : String(e)
        stats.rejected++
        stats.errors.push(reason)
        if (!res.headersSent && !req.socket.destroyed) res.status(402).json(challenge(req, reason))
      },
    )
  }
  app.use(paidRoute)
  addRoutes(app, 'spec')
  const server = await listen(app, timers)
  base = server.url
  return {
    kind: opts.shape === 'simple' ? 'spec-simple' : 'spec-accepts',
    url: server.url,
    network,
    stats,
    get faults() {
      return faults.faults
    },
    setFaults: (f) => faults.set(f),
    close: () => server.close(),
  }
}
