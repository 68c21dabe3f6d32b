import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createPublicClient, createWalletClient, http, type Hex } from 'viem'
import { privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'

/**
 * A sub-agent for invocation tests: an HTTP server that takes `POST {task}` from Paygate with
 * the invocation headers, runs `work` (which pays real merchants through Paygate with the token:
 * `POST /v1/pay` or the proxy, or nests an invocation), and answers `{output}`. With `price` it
 * first answers 402 (the spec's x402 shape) and settles the orchestrator's payment on chain
 * before working, like any paid target.
 */
export interface SubAgentCall {
  task: unknown
  token: string
  parentTx: string
  budgetRemaining: string
  /** `POST /v1/pay` as this sub-agent, with the token (unless `token: null`). */
  pay(endpoint: string, opts?: { token?: string | null; parentTxHash?: string }): Promise<{ status: number; body: any }>
  /** A GET through Paygate's proxy as this sub-agent, with the token header. */
  proxyGet(url: string): Promise<{ status: number; error: string | undefined; paidTx: string | undefined }>
  /** `POST /v1/agents/invoke` as this sub-agent, nesting under the invocation it was called in. */
  invoke(body: Record<string, unknown>): Promise<{ status: number; body: any }>
}

export interface SubAgentOptions {
  apiUrl: string
  proxyUrl: string
  agentId: string
  agentKey: string
  work(call: SubAgentCall): Promise<unknown>
  /** Charge the orchestrator this much (base units) per task, settled on `chain`. */
  price?: bigint
  chain?: { rpcUrl: string; chainId: number; network: string; token: Hex; facilitatorKey: Hex; payTo: Hex }
}

export interface SubAgent {
  url: string
  /** Tasks received (paid or free), and the headers each came with. */
  calls: { token: string; parentTx: string; budgetRemaining: string; task: unknown }[]
  settlements: number
  close(): Promise<void>
}

async function json(url: string, method: string, headers: Record<string, string>, body?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(url, {
    method,
    headers: { ...headers, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : undefined }
}

const readAll = async (req: IncomingMessage): Promise<string> => {
  const chunks: Buffer[] = []
  for await (const c of req) chunks.push(c as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

export async function startSubAgent(o: SubAgentOptions): Promise<SubAgent> {
  const calls: SubAgent['calls'] = []
  let settlements = 0
  const auth = { authorization: `Bearer ${o.agentKey}` }
  const proxy = new URL(o.proxyUrl)
  const basic = `Basic ${Buffer.from(`${o.agentId}:${o.agentKey}`).toString('base64')}`

  const settle = async (xPayment: string, signature: string): Promise<boolean> => {
    const c = o.chain!
    const chain = viemChain(c.chainId, c.network, c.rpcUrl)
    const pub = createPublicClient({ chain, transport: http(c.rpcUrl), pollingInterval: 20 })
    const wc = createWalletClient({ account: privateKeyToAccount(c.facilitatorKey), chain, transport: http(c.rpcUrl) })
    const p = JSON.parse(Buffer.from(xPayment, 'base64').toString()).payload
    const hash = await wc.writeContract({
      address: c.token,
      abi: paygateUsdcAbi,
      functionName: 'transferWithAuthorization',
      args: [p.from, p.to, BigInt(p.amount), BigInt(p.validAfter), BigInt(p.validBefore), p.nonce, signature as Hex],
    })
    return (await pub.waitForTransactionReceipt({ hash })).status === 'success'
  }

  const server: Server = createServer(async (req, res) => {
    try {
      const raw = await readAll(req)
      if (o.price && o.chain) {
        const xp = req.headers['x-payment']
        if (!xp) {
          const resource = `http://127.0.0.1:${(server.address() as AddressInfo).port}${req.url}`
          const offer = { scheme: 'exact', network: `eip155:${o.chain.chainId}`, token: o.chain.token, amount: o.price.toString(), payTo: o.chain.payTo, resource }
          return void res.writeHead(402, { 'content-type': 'application/json' }).end(JSON.stringify(offer))
        }
        if (!(await settle(String(xp), String(req.headers['x-payment-signature'])))) return void res.writeHead(402).end('{"error":"settlement failed"}')
        settlements++
      }
      const token = String(req.headers['x-paygate-invocation'] ?? '')
      const parentTx = String(req.headers['x-paygate-parent-tx'] ?? '')
      const budgetRemaining = String(req.headers['x-paygate-budget-remaining'] ?? '')
      const task = (JSON.parse(raw) as { task: unknown }).task
      calls.push({ token, parentTx, budgetRemaining, task })
      const call: SubAgentCall = {
        task,
        token,
        parentTx,
        budgetRemaining,
        pay: (endpoint, po = {}) => {
          const tok = po.token === undefined ? token : po.token
          return json(
            `${o.apiUrl}/v1/pay`,
            'POST',
            { ...auth, ...(tok !== null ? { 'x-paygate-invocation': tok } : {}) },
            {
              agentId: o.agentId,
              endpoint,
              ...(po.parentTxHash ? { parentTxHash: po.parentTxHash } : {}),
            },
          )
        },
        proxyGet: (url) =>
          new Promise((resolve, reject) => {
            const r = httpRequest({ host: proxy.hostname, port: proxy.port, path: url, headers: { 'proxy-authorization': basic, 'x-paygate-invocation': token } }, (answer) => {
              answer.resume()
              const h = answer.headers
              resolve({ status: answer.statusCode ?? 0, error: h['x-paygate-error'] as string | undefined, paidTx: h['x-paygate-tx'] as string | undefined })
            })
            r.on('error', reject)
            r.end()
          }),
        invoke: (body) => json(`${o.apiUrl}/v1/agents/invoke`, 'POST', { ...auth, 'x-agent-id': o.agentId, 'x-paygate-invocation': token }, body),
      }
      const output = await o.work(call)
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ output }))
    } catch (e) {
      res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ error: String(e) }))
    }
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/task`,
    calls,
    get settlements() {
      return settlements
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections()
        server.close(() => r())
      }),
  }
}
