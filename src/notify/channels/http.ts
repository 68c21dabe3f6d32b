import { request as httpRequest } from 'node:http'
import { request as httpsRequest } from 'node:https'
import { isIP } from 'node:net'
import type { EgressGuard } from '../../net/egress.js'

/** What one attempt got: a status, or none (refused, timed out, reset). */
export interface AttemptResult {
  status: number | null
  error: string | null
}

/**
 * POST `body` to an operator's URL within `timeoutMs` (the whole exchange). The connection
 * passes the egress guard as an operator target: private addresses are allowed, Paygate's
 * own ports and metadata addresses never.
 */
export function postJson(egress: EgressGuard, url: string, body: string, headers: Record<string, string>, timeoutMs: number): Promise<AttemptResult> {
  return new Promise((resolve) => {
    let done = false
    const finish = (r: AttemptResult): void => {
      if (done) return
      done = true
      clearTimeout(timer)
      resolve(r)
    }
    let u: URL
    let conn: ReturnType<EgressGuard['connectOptions']>
    try {
      u = new URL(url)
      const port = Number(u.port) || (u.protocol === 'https:' ? 443 : 80)
      conn = egress.connectOptions(u.hostname.replace(/^\[|\]$/g, ''), port, { operator: true })
    } catch (e) {
      resolve({ status: null, error: (e as Error).message })
      return
    }
    const make = u.protocol === 'https:' ? httpsRequest : httpRequest
    const req = make({
      ...conn,
      port: Number(u.port) || undefined,
      path: `${u.pathname}${u.search}`,
      method: 'POST',
      // TLS verifies the name asked for (SNI takes names only).
      ...(u.protocol === 'https:' && !isIP(u.hostname.replace(/^\[|\]$/g, '')) ? { servername: u.hostname } : {}),
      headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), 'user-agent': 'paygate-notify/1', ...authHeader(u), ...headers },
      agent: false,
    })
    const timer = setTimeout(() => {
      req.destroy()
      finish({ status: null, error: `no answer within ${timeoutMs} ms` })
    }, timeoutMs)
    req.on('error', (e) => finish({ status: null, error: e.message }))
    req.on('response', (res) => {
      // Read and drop at most 64 KiB of the answer; the status is what counts.
      let seen = 0
      res.on('data', (c: Buffer) => {
        seen += c.length
        if (seen > 65_536) res.destroy()
      })
      res.on('close', () => {
        const status = res.statusCode ?? null
        finish({ status, error: status !== null && status >= 200 && status < 300 ? null : `answered ${status}` })
      })
      res.on('error', () => {})
    })
    req.end(body)
  })
}

/** Credentials in the URL's userinfo go as Basic authorization, as a browser would send them. */
function authHeader(u: URL): Record<string, string> {
  if (!u.username && !u.password) return {}
  return { authorization: `Basic ${Buffer.from(`${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`).toString('base64')}` }
}
