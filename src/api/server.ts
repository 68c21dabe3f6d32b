import { STATUS_CODES, createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { Duplex } from 'node:stream'
import { unredacted, type Logger } from '../log/index.js'
import type { Identity, Registry } from '../agents/registry.js'
import { PaygateError, toPaygateError } from '../errors/index.js'
import { errorReply, readJsonBody, sendReply } from './http.js'
import type { ApiRateLimits } from './rate-limit.js'
import type { Reply, Router } from './router.js'

export interface ApiDeps {
  router: Router
  registry: Registry
  rateLimit: ApiRateLimits
  log: Logger
  maxBodyBytes: number
}

const BEARER_RE = /^Bearer[ \t]+(\S+)[ \t]*$/i

/** 401 for a missing, malformed or revoked key; the identity otherwise. */
async function authenticate(req: IncomingMessage, registry: Registry): Promise<Identity> {
  const header = req.headers.authorization
  if (!header) throw new PaygateError('unauthorized', 'missing Authorization: Bearer <API key>')
  const m = BEARER_RE.exec(header)
  if (!m) throw new PaygateError('unauthorized', 'malformed Authorization header; expected Bearer <API key>')
  const id = await registry.verify(m[1]!)
  if (!id) throw new PaygateError('unauthorized', 'API key is malformed, unknown or revoked')
  return id
}

/**
 * Where Node's bare answer to a refused request has a status of its own, it is kept: 413 is
 * our `payload_too_large`; 431 and 408 have no code of ours, so their body says
 * `invalid_request`. Anything else the parser refuses is 400 `invalid_request`.
 */
const PARSER_ERRORS: Record<string, { status: number; error: PaygateError }> = {
  HPE_HEADER_OVERFLOW: { status: 431, error: new PaygateError('invalid_request', 'request headers are too large') },
  HPE_CHUNK_EXTENSIONS_OVERFLOW: { status: 413, error: new PaygateError('payload_too_large', 'chunk extensions are too large') },
  ERR_HTTP_REQUEST_TIMEOUT: { status: 408, error: new PaygateError('invalid_request', 'the request was not received in time') },
}

/**
 * A request Node's HTTP parser refuses (a bad header line, `Content-Length: abc`) is answered
 * with the spec's error body instead of Node's bare status line, and the connection closed.
 */
function answerClientError(e: NodeJS.ErrnoException & { reason?: string }, socket: Duplex): void {
  if (e.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy()
    return
  }
  const { status, error } = PARSER_ERRORS[e.code ?? ''] ?? { status: 400, error: new PaygateError('invalid_request', `malformed HTTP request: ${e.reason ?? e.message}`) }
  const body = JSON.stringify(error.toBody())
  const head = [
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}`,
    'content-type: application/json; charset=utf-8',
    `content-length: ${Buffer.byteLength(body)}`,
    'cache-control: no-store',
    'connection: close',
  ]
  socket.end(`${head.join('\r\n')}\r\n\r\n${body}`, () => socket.destroy())
}

/** Who called, for the limits: 401 for a bad key, or 429 once its address has sent too many. */
async function caller(req: IncomingMessage, registry: Registry, limits: ApiRateLimits): Promise<Identity> {
  try {
    return await authenticate(req, registry)
  } catch (e) {
    limits.refused(req.socket.remoteAddress ?? 'unknown')
    throw e
  }
}

/** The /v1 API and health endpoints on one node:http server. */
export function createApiServer(deps: ApiDeps): Server {
  const { router, registry, rateLimit, log, maxBodyBytes } = deps
  /** The access line's fields are fixed and secret-free: no redaction pass on the hot path. */
  const access = unredacted(log)

  /** `seen` collects the caller's identity for the access log, also when the handler fails. */
  async function handle(req: IncomingMessage, url: URL, seen: { identity: Identity | null }): Promise<Reply> {
    const match = router.match(req.method ?? 'GET', url.pathname)
    if (!match) throw new PaygateError('not_found', `no such endpoint: ${req.method} ${url.pathname}`)
    if ('allow' in match) {
      throw new PaygateError('method_not_allowed', `${req.method} is not allowed on ${url.pathname}`, {}, { allow: match.allow.join(', ') })
    }
    const { route, params } = match
    if (route.access !== 'public') {
      seen.identity = await caller(req, registry, rateLimit)
      if (route.access === 'account' && seen.identity.kind !== 'account') {
        throw new PaygateError('forbidden', 'this operation needs the account-level key (rp_live_…)')
      }
      rateLimit.admit(seen.identity)
    }
    let parsed: Promise<unknown> | undefined
    return route.handler({
      url,
      params,
      identity: seen.identity,
      body: () => (parsed ??= readJsonBody(req, maxBodyBytes, route.maxJsonDepth)),
    })
  }

  /**
   * Per socket, the responses under way and the parser error to answer once they are done:
   * the error answer must not cut into them (a bad request pipelined behind good ones).
   */
  const inFlight = new WeakMap<Duplex, { responses: number; refused?: () => void }>()

  const server = createServer({ keepAliveTimeout: 65_000 }, (req: IncomingMessage, res: ServerResponse) => {
    const started = process.hrtime.bigint()
    let flight = inFlight.get(req.socket)
    if (!flight) inFlight.set(req.socket, (flight = { responses: 0 }))
    flight.responses++
    res.once('close', () => {
      if (--flight!.responses === 0) flight!.refused?.()
    })
    let url: URL
    try {
      url = new URL(req.url ?? '/', 'http://api.local')
    } catch {
      sendReply(res, errorReply(new PaygateError('invalid_request', 'malformed request target', { field: 'path' })))
      return
    }
    const seen: { identity: Identity | null } = { identity: null }
    handle(req, url, seen)
      .then(
        (reply) => reply,
        (e: unknown) => {
          const err = toPaygateError(e)
          if (err.code === 'internal_error') log.error({ err: e, path: url.pathname }, 'request failed')
          else if (err.code === 'unavailable' && err.cause !== undefined) log.warn({ err, path: url.pathname }, 'request failed: a dependency is not answering')
          if (err.code === 'payload_too_large') res.setHeader('connection', 'close')
          return errorReply(err)
        },
      )
      .then((reply) => {
        if (!res.headersSent) sendReply(res, reply)
        const ms = Number(process.hrtime.bigint() - started) / 1e6
        access.info(
          {
            method: req.method,
            path: url.pathname,
            status: reply.status,
            ms: Math.round(ms * 100) / 100,
            ...(seen.identity ? { keyId: seen.identity.keyId } : {}),
            ...(seen.identity?.kind === 'agent' ? { agentId: seen.identity.agentId } : {}),
          },
          'api request',
        )
      })
      .catch((e: unknown) => log.error({ err: e }, 'could not send reply'))
  })
  /** Sockets whose parser error is answered already: the parser reports it again on every later chunk. */
  const refused = new WeakSet<Duplex>()
  server.on('clientError', (e: NodeJS.ErrnoException, socket: Duplex) => {
    if (refused.has(socket)) return
    refused.add(socket)
    const flight = inFlight.get(socket)
    if (flight?.responses) flight.refused = () => answerClientError(e, socket)
    else answerClientError(e, socket)
  })
  return server
}
