/**
 * The demo's merchant: a plain HTTP server on 127.0.0.1 that sells one JSON answer for a
 * fixed price and really settles every payment on the chain it is given (the embedded
 * chain), as a merchant with its own facilitator would: it checks the EIP-3009
 * authorization's terms and signer, sends `transferWithAuthorization` from its own gas-paying
 * key, waits for the receipt and only then serves.
 *
 * - `GET /paid`: offers x402 v2 (`PAYMENT-REQUIRED` header; paid with `PAYMENT-SIGNATURE`,
 *   answered with `PAYMENT-RESPONSE`) and MPP (`mpp/1.0` body, paid at `POST /mpp/pay`) in
 *   one 402.
 * - `GET /mpp`: the same thing, offered only over MPP.
 * - `GET /free`: no payment.
 */
import { randomBytes } from 'node:crypto'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import { createPublicClient, createWalletClient, getAddress, http, recoverTypedDataAddress, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../chain/chain.js'
import { TRANSFER_WITH_AUTHORIZATION_TYPES } from '../protocols/x402/payment.js'
import { paygateUsdcAbi } from '../chain/contracts/abis.js'
import { parseDecimal } from '../util/money.js'

export interface DemoChain {
  rpcUrl: string
  chainId: number
  network: string
  token: Hex
}

export interface DemoMerchant {
  url: string
  payTo: Hex
  /** The price in USDC base units. */
  units: bigint
  /** Settlement transactions, newest last. */
  settlements: Hex[]
  close(): Promise<void>
}

interface Authorization {
  from: Hex
  to: Hex
  value: bigint
  validAfter: bigint
  validBefore: bigint
  nonce: Hex
  signature: Hex
}

class Refusal extends Error {}

const readBody = async (req: IncomingMessage): Promise<string> => {
  let s = ''
  for await (const c of req) s += c
  return s
}
const send = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void => {
  const text = JSON.stringify(body)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers })
  res.end(text)
}
const b64 = (v: unknown): string => Buffer.from(JSON.stringify(v)).toString('base64')

/** Serve `handle` on 127.0.0.1:`port`; `close` also ends kept-alive connections. */
async function serve(handle: (req: IncomingMessage, res: ServerResponse) => Promise<void>, port: number): Promise<{ port: number; close: () => Promise<void> }> {
  const sockets = new Set<Socket>()
  const server = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      if (!res.headersSent) send(res, e instanceof Refusal ? 402 : 500, { error: e instanceof Refusal ? e.message : `merchant error: ${(e as Error).message}` })
    })
  })
  server.on('connection', (s) => {
    sockets.add(s)
    s.on('close', () => sockets.delete(s))
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, '127.0.0.1', () => resolve())
  })
  const close = (): Promise<void> =>
    new Promise<void>((resolve) => {
      server.close(() => resolve())
      for (const s of sockets) s.destroy()
    })
  return { port: (server.address() as AddressInfo).port, close }
}

/** Start the merchant on 127.0.0.1 (port 0 picks one); its gas key is funded with the devnet's anvil_setBalance. */
/** Settles authorizations on the chain with a fresh gas key (funded with the devnet's anvil_setBalance), one at a time. */
async function demoSettler(chain: DemoChain, units: bigint, payTo: Hex): Promise<{ settle: (a: Authorization) => Promise<Hex>; settlements: Hex[] }> {
  const token = getAddress(chain.token)
  const transport = http(chain.rpcUrl)
  const vchain = viemChain(chain.chainId, chain.network, chain.rpcUrl)
  const gas = privateKeyToAccount(generatePrivateKey())
  const pub = createPublicClient({ chain: vchain, transport, pollingInterval: 50 })
  const wallet = createWalletClient({ chain: vchain, transport, account: gas })
  await pub.request({ method: 'anvil_setBalance' as never, params: [gas.address, '0xde0b6b3a7640000'] as never })
  const domain = { name: 'USD Coin', version: '2', chainId: chain.chainId, verifyingContract: token } as const
  const settlements: Hex[] = []
  let queue: Promise<unknown> = Promise.resolve()

  /** Check the authorization's terms and signer, then settle it; one at a time (one gas key, one nonce sequence). */
  async function settle(a: Authorization): Promise<Hex> {
    if (getAddress(a.to) !== payTo) throw new Refusal('recipient_mismatch')
    if (a.value !== units) throw new Refusal(`amount_mismatch: ${a.value} != ${units}`)
    const signer = await recoverTypedDataAddress({ domain, types: TRANSFER_WITH_AUTHORIZATION_TYPES, primaryType: 'TransferWithAuthorization', message: a, signature: a.signature }).catch(() => null)
    if (!signer || signer !== getAddress(a.from)) throw new Refusal('invalid_signature')
    const run = queue.then(async () => {
      const args = [a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, a.signature] as const
      const hash = await wallet.writeContract({ address: token, abi: paygateUsdcAbi, functionName: 'transferWithAuthorization', args })
      const receipt = await pub.waitForTransactionReceipt({ hash, timeout: 30_000 })
      if (receipt.status !== 'success') throw new Refusal(`settlement_reverted: ${hash}`)
      settlements.push(hash)
      return hash
    })
    queue = run.catch(() => undefined)
    return run
  }
  return { settle, settlements }
}

export async function startDemoMerchant(chain: DemoChain, price = '0.01', port = 0): Promise<DemoMerchant> {
  const units = parseDecimal(price)
  const caip = `eip155:${chain.chainId}`
  const token = getAddress(chain.token)
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const { settle, settlements } = await demoSettler(chain, units, payTo)

  let base = ''
  const x402Offer = () => ({ scheme: 'exact', network: caip, amount: units.toString(), asset: token, payTo, maxTimeoutSeconds: 120, extra: { name: 'USD Coin', version: '2' } })
  const mppOffer = () => ({
    protocol: 'mpp/1.0',
    amount: { value: price, currency: 'USD' },
    paymentMethods: ['tempo'],
    sessionSupported: false,
    paymentEndpoint: '/mpp/pay',
    payTo,
    network: caip,
    token,
  })
  const resource = (path: string, paidWith: string) => ({ ok: true, item: 'a paid answer from the Paygate demo merchant', path, paidWith })

  function challenge(res: ServerResponse, path: string, x402: boolean): void {
    const headers: Record<string, string> = {}
    if (x402)
      headers['payment-required'] = b64({ x402Version: 2, error: 'payment required', resource: { url: base + path, description: 'demo', mimeType: 'application/json' }, accepts: [x402Offer()] })
    send(res, 402, mppOffer(), headers)
  }

  async function payX402(res: ServerResponse, path: string, header: string): Promise<void> {
    const p = JSON.parse(Buffer.from(header, 'base64').toString())
    if (JSON.stringify(p.accepted) !== JSON.stringify(x402Offer())) throw new Refusal('accepted_mismatch')
    const a = p.payload.authorization
    const tx = await settle({ ...a, value: BigInt(a.value), validAfter: BigInt(a.validAfter), validBefore: BigInt(a.validBefore), signature: p.payload.signature })
    send(res, 200, resource(path, 'x402'), { 'payment-response': b64({ success: true, transaction: tx, network: caip, payer: a.from }) })
  }

  async function payMpp(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const b = JSON.parse(await readBody(req))
    const a = b.authorization ?? {}
    if (b.method !== 'tempo' || a.type !== 'eip3009') throw new Refusal(`unsupported: ${b.method}/${a.type}`)
    if (a.network !== caip || getAddress(a.token) !== token) throw new Refusal('wrong_chain_or_token')
    const tx = await settle({ from: a.from, to: a.to, value: BigInt(a.value), validAfter: BigInt(a.validAfter), validBefore: BigInt(a.validBefore), nonce: a.nonce, signature: a.signature })
    const headers = { 'x-mpp-session': `sess_${randomBytes(12).toString('hex')}`, 'x-payment-response': b64({ success: true, transaction: tx, network: caip, payer: a.from }) }
    send(res, 200, resource(new URL(String(b.resource ?? base), base).pathname, 'mpp'), headers)
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? '/', 'http://demo').pathname
    if (path === '/free') return send(res, 200, { ok: true, free: true })
    if (path === '/mpp/pay' && req.method === 'POST') return payMpp(req, res)
    if (path !== '/paid' && path !== '/mpp') return send(res, 404, { error: 'not_found', detail: 'routes: GET /paid (x402 v2 and MPP), GET /mpp (MPP only), GET /free' })
    const sig = req.headers['payment-signature']
    if (path === '/paid' && typeof sig === 'string') return payX402(res, path, sig)
    return challenge(res, path, path === '/paid')
  }

  const served = await serve(handle, port)
  base = `http://127.0.0.1:${served.port}`
  return { url: base, payTo, units, settlements, close: served.close }
}
