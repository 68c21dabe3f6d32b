import { connect } from 'node:net'

export interface RawExchange {
  /** Everything the server sent until it closed the connection (latin1). */
  text: string
  /** The socket's error (ECONNRESET: the server reset the connection), if any. */
  error: string | null
  /** The first response's status, headers and body (as much as arrived). */
  status: number
  headers: Record<string, string>
  body: string
}

/**
 * Send `parts` in order on a new loopback connection (each write waits for the socket to
 * drain; `pauseMs` between parts), optionally half-close, and collect what comes back until
 * the server closes; fails after `limitMs`.
 */
export function rawExchange(port: number, parts: (string | Buffer)[], opts: { end?: boolean; pauseMs?: number; limitMs?: number } = {}): Promise<RawExchange> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    let error: string | null = null
    const socket = connect(port, '127.0.0.1', async () => {
      try {
        for (const p of parts) {
          if (socket.destroyed) return
          if (!socket.write(p)) await new Promise((r) => socket.once('drain', r))
          if (opts.pauseMs) await new Promise((r) => setTimeout(r, opts.pauseMs))
        }
        if (opts.end && !socket.destroyed) socket.end()
      } catch {
        // the socket's error event says what happened
      }
    })
    socket.on('data', (d) => chunks.push(d))
    socket.on('error', (e: NodeJS.ErrnoException) => (error = e.code ?? e.message))
    socket.on('close', () => {
      clearTimeout(timer)
      resolve(parse(Buffer.concat(chunks).toString('latin1'), error))
    })
    const timer = setTimeout(() => {
      socket.destroy()
      reject(new Error(`the server did not close the connection within ${opts.limitMs ?? 15_000} ms`))
    }, opts.limitMs ?? 15_000)
  })
}

function parse(text: string, error: string | null): RawExchange {
  const end = text.indexOf('\r\n\r\n')
  const [statusLine = '', ...lines] = text.slice(0, end < 0 ? undefined : end).split('\r\n')
  const headers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]))
  const length = headers['content-length'] === undefined ? undefined : Number(headers['content-length'])
  const body = end < 0 ? '' : text.slice(end + 4, length === undefined ? undefined : end + 4 + length)
  return { text, error, status: Number(statusLine.split(' ')[1] ?? 0), headers, body }
}

/** `n` bytes of body as chunks of the chunked coding, `size` bytes each, then the last chunk. */
export function chunked(n: number, size = 64 * 1024): Buffer[] {
  const out: Buffer[] = []
  for (let sent = 0; sent < n; sent += size) {
    const len = Math.min(size, n - sent)
    out.push(Buffer.concat([Buffer.from(`${len.toString(16)}\r\n`), Buffer.alloc(len, 0x20), Buffer.from('\r\n')]))
  }
  out.push(Buffer.from('0\r\n\r\n'))
  return out
}

export const basic = (user: string, pass: string): string => `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`
