import { request } from 'node:http'
import type { Test } from 'tap'
import type { Answer, Contract } from './openapi-contract.js'

/**
 * Requests for the contract tests: node:http, so the raw headers and body are seen as sent,
 * from a chosen loopback source address (`from`): the API limits requests without a valid key
 * per client address, and a test exhausts one address without touching the others.
 */
export interface Req {
  method: string
  path: string
  /** Bearer key; null: no Authorization header. */
  key?: string | null
  body?: unknown
  rawBody?: string | Buffer
  headers?: Record<string, string>
  /** Source address, e.g. 127.0.3.7 (default 127.0.0.1). */
  from?: string
}

export interface Reply extends Answer {
  /** The parsed JSON body, or undefined. */
  body: any
}

export function send(baseUrl: string, r: Req): Promise<Reply> {
  const url = new URL(r.path, baseUrl)
  const headers: Record<string, string | number> = { ...r.headers }
  if (r.key) headers.authorization = `Bearer ${r.key}`
  let data: Buffer | undefined
  if (r.body !== undefined) {
    data = Buffer.from(JSON.stringify(r.body))
    headers['content-type'] ??= 'application/json'
  } else if (r.rawBody !== undefined) data = Buffer.from(r.rawBody)
  if (data) headers['content-length'] = data.length
  return new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, path: url.pathname + url.search, method: r.method, headers, localAddress: r.from ?? '127.0.0.1', agent: false }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (c: Buffer) => chunks.push(c))
      res.on('error', reject)
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8')
        let body: unknown
        try {
          body = text ? JSON.parse(text) : undefined
        } catch {
          body = undefined
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text, body })
      })
    })
    req.on('error', reject)
    req.end(data)
  })
}

/** Send `r`, assert the status (and the error code, when given) and that the answer keeps the contract. */
export function contractCaller(baseUrl: string, contract: Contract) {
  return async function expectAnswer(t: Test, r: Req, status: number, error?: string): Promise<Reply> {
    const res = await send(baseUrl, r)
    const label = `${r.method} ${r.path}`
    t.equal(res.status, status, `${label}: ${status}${error ? ` ${error}` : ''} (got ${res.text.slice(0, 300)})`)
    if (error !== undefined) t.equal(res.body?.error, error, `${label}: error ${error}`)
    t.same(contract.check(r.method, r.path, res), [], `${label} ${res.status}: keeps the contract`)
    return res
  }
}
