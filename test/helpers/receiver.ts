import { createHmac, timingSafeEqual } from 'node:crypto'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { Test } from 'tap'
import { listenForTest } from './listen.js'

export interface Received {
  path: string
  headers: IncomingMessage['headers']
  raw: Buffer
  body: any
  /** Whether the signature matched (when the receiver knows the secret). */
  verified: boolean | null
  answered: number | null
}

/**
 * A webhook receiver as docs/alerts.md tells operators to write one: it recomputes
 * `sha256=<hex HMAC-SHA256 of the raw body>` with the secret and compares in constant time,
 * answering 401 on a mismatch. `mode` makes it answer 200, fail with 500, or hang.
 */
export async function startReceiver(t: Test, opts: { secret?: () => string | null } = {}) {
  const got: Received[] = []
  const hanging: ServerResponse[] = []
  let mode: 'ok' | 'fail' | 'hang' = 'ok'
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const raw = Buffer.concat(chunks)
      const secret = opts.secret?.() ?? null
      const verified = secret === null ? null : verify(secret, raw, req.headers['x-service-signature'])
      let body: unknown
      try {
        body = JSON.parse(raw.toString('utf8'))
      } catch {
        body = undefined
      }
      const rec: Received = { path: req.url ?? '', headers: req.headers, raw, body, verified, answered: null }
      got.push(rec)
      if (mode === 'hang') {
        hanging.push(res)
        return
      }
      rec.answered = verified === false ? 401 : mode === 'fail' ? 500 : 200
      res.writeHead(rec.answered).end()
    })
  })
  const port = await listenForTest(t, server)
  t.teardown(() => {
    for (const r of hanging) r.destroy()
  })
  return {
    url: `http://127.0.0.1:${port}`,
    got,
    setMode(m: 'ok' | 'fail' | 'hang') {
      mode = m
    },
    /** Wait (bounded) until `n` requests arrived; returns them. */
    async waitFor(n: number, ms = 15_000): Promise<Received[]> {
      const end = Date.now() + ms
      while (got.length < n && Date.now() < end) await new Promise((r) => setTimeout(r, 20))
      return got
    },
  }
}

/** Constant-time check of `X-Service-Signature` against the raw body. */
export function verify(secret: string, raw: Buffer, header: string | string[] | undefined): boolean {
  if (typeof header !== 'string' || !header.startsWith('sha256=')) return false
  const expected = Buffer.from(createHmac('sha256', secret).update(raw).digest('hex'), 'utf8')
  const given = Buffer.from(header.slice('sha256='.length), 'utf8')
  return given.length === expected.length && timingSafeEqual(given, expected)
}
