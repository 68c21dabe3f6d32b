import type { IncomingMessage, ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import { Duplex, Readable } from 'node:stream'
import { RequestTimeoutError } from '../errors/index.js'

/**
 * The tunnel's first bytes, leaving the socket paused; null if it ends, closes or stays
 * silent for `timeoutMs` first (the fast path's idle limit takes over from the first byte).
 */
export function firstChunk(socket: Socket, timeoutMs: number): Promise<Buffer | null> {
  return new Promise((resolve) => {
    const settle = (d: Buffer | null): void => {
      socket.off('data', onData)
      socket.off('end', onEnd)
      socket.off('close', onEnd)
      socket.off('timeout', onEnd)
      socket.setTimeout(0)
      resolve(d)
    }
    const onData = (d: Buffer): void => {
      socket.pause()
      settle(d)
    }
    const onEnd = (): void => settle(null)
    socket.on('data', onData)
    socket.on('end', onEnd)
    socket.on('close', onEnd)
    socket.on('timeout', onEnd)
    socket.setTimeout(timeoutMs)
    socket.resume()
  })
}

/** `p`, or a 408 `invalid_request` once `ms` have passed first. */
export function byDeadline<T>(p: Promise<T>, ms: number, detail: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new RequestTimeoutError(detail)), ms)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}

/**
 * The rest of a request body, after the `head` already read, as a stream of its own for a
 * single upstream send. Destroying it (the target failed) leaves the agent's connection
 * alone: the rest of the body is read and dropped, so the answer still reaches the agent
 * (a socket closed with unread bytes is reset, and the answer with it).
 */
export function onward(req: IncomingMessage, head: Buffer): Readable {
  const onData = (c: Buffer): void => {
    if (!out.push(c)) req.pause()
  }
  const onEnd = (): void => {
    out.push(null)
  }
  const onError = (e: Error): void => {
    out.destroy(e)
  }
  const out = new Readable({
    read() {
      req.resume()
    },
    destroy(err, cb) {
      req.off('data', onData)
      req.off('end', onEnd)
      req.off('error', onError)
      req.resume()
      cb(err)
    },
  })
  if (head.length) out.push(head)
  req.on('data', onData)
  req.on('end', onEnd)
  req.on('error', onError)
  return out
}

/**
 * The tunnel as a JS stream that starts with the bytes already read, for the HTTP parser,
 * which takes a net.Socket's native handle directly and would skip data put back with
 * unshift(). (TLSSocket does read what was put back, so intercepted TLS runs on the handle.)
 */
export function replayable(socket: Socket, first: Buffer): Duplex {
  const d = new Duplex({
    read() {
      socket.resume()
    },
    write(chunk: Buffer, _enc, cb) {
      socket.write(chunk, cb)
    },
    final(cb) {
      socket.end(cb)
    },
    destroy(err, cb) {
      socket.destroy(err ?? undefined)
      cb(err)
    },
  })
  // Node's HTTP server arms its keep-alive and request timeouts through these.
  ;(d as Duplex & { setTimeout(ms: number, cb?: () => void): Duplex }).setTimeout = (ms, cb) => {
    socket.setTimeout(ms)
    if (cb) d.once('timeout', cb)
    return d
  }
  socket.on('timeout', () => d.emit('timeout'))
  d.push(first)
  socket.on('data', (c: Buffer) => {
    if (!d.push(c)) socket.pause()
  })
  socket.on('end', () => d.push(null))
  socket.on('close', () => d.destroy())
  socket.on('error', (e) => d.destroy(e))
  return d
}

/**
 * Stream an upstream body to the agent with backpressure. Plain pipe() rather than
 * stream.pipeline(): pipeline builds and aborts an AbortController (a DOMException with a
 * stack) per call, measurable on the passthrough hot path.
 */
export function relay(body: Readable, res: ServerResponse): Promise<void> {
  return new Promise((resolve, reject) => {
    const fail = (e: Error): void => {
      body.destroy()
      res.destroy()
      reject(e)
    }
    body.once('error', fail)
    res.once('close', () => {
      if (!res.writableFinished) body.destroy()
      resolve()
    })
    res.once('finish', () => resolve())
    body.pipe(res)
  })
}
