import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { Duplex } from 'node:stream'
import { unredacted, type Logger } from '../log/index.js'
import type { Identity, Registry } from '../agents/registry.js'
import { PaygateError, RequestTimeoutError, toPaygateError } from '../errors/index.js'
import { closingAnswer, errorJson, parserRefusal } from '../errors/http.js'
import { endLingering } from '../util/linger.js'
import { readJsonBody, sendReply } from './http.js'
import type { ApiRateLimits } from './rate-limit.js'
import { DashboardAssets } from './dashboard.js'
import type { Reply, Router } from './router.js'

export interface ApiDeps {
  router: Router
  registry: Registry
  rateLimit: ApiRateLimits
  log: Logger
  maxBodyBytes: number
  /** Deadline for a whole request, head and body, from its first byte (`api.requestTimeoutMs`). */
  requestTimeoutMs: number
  /** The dashboard's static assets under `/ui/` (`/` redirects there); absent: those paths are 404. */
  dashboard?: DashboardAssets
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
 * A request Node's HTTP parser refuses (a bad header line, `Content-Length: abc`) is answered
 * with the spec's error body instead of Node's bare status line, and the connection closed.
 */
function answerClientError(e: NodeJS.ErrnoException & { reason?: string }, socket: Duplex): void {
  if (e.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy()
    return
  }
  const { status, error } = parserRefusal(e)
  // The API's own error answer (as sendReply writes it), not the proxy's: no X-Paygate-Error.
  const body = JSON.stringify(errorJson(error).body)
  const headers = { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store' }
  endLingering(socket, closingAnswer(status, headers, body))
}

/**
 * Per socket, the responses under way and the parser error to answer once they are done (the
 * error answer must not cut into them: a bad request pipelined behind good ones). `late`
 * fails the body read under way when the request's deadline passes; `timedOut` any later one.
 */
interface Flight {
  responses: number
  refused?: () => void
  late?: () => void
  timedOut?: boolean
}

/** The body, or the deadline's 408 if the request is not in by then (Node's requestTimeout reports it as a client error). */
function bodyWithin(flight: Flight, read: () => Promise<unknown>): Promise<unknown> {
  if (flight.timedOut) return Promise.reject(new RequestTimeoutError())
  return new Promise((resolve, reject) => {
    flight.late = () => reject(new RequestTimeoutError())
    read()
      .then(resolve, reject)
      .finally(() => (flight.late = undefined))
  })
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

/** Who called, as far as the request got: for the access log, also when the handler fails. */
interface Seen {
  identity: Identity | null
}

/** Route, authenticate, rate-limit and run one request. */
async function handle(deps: ApiDeps, req: IncomingMessage, url: URL, seen: Seen, flight: Flight): Promise<Reply> {
  const { router, registry, rateLimit, maxBodyBytes } = deps
  if (deps.dashboard && DashboardAssets.owns(url.pathname)) return deps.dashboard.answer(req.method ?? 'GET', url.pathname)
  // Under /v1 a caller without a valid key learns nothing of which paths or methods exist: 401 first.
  const v1 = url.pathname === '/v1' || url.pathname.startsWith('/v1/')
  if (v1 && !router.isPublicPath(url.pathname)) seen.identity = await caller(req, registry, rateLimit)
  const match = router.match(req.method ?? 'GET', url.pathname)
  if (!match) throw new PaygateError('not_found', `no such endpoint: ${req.method} ${url.pathname}`)
  if ('allow' in match) {
    throw new PaygateError('method_not_allowed', `${req.method} is not allowed on ${url.pathname}`, { headers: { allow: match.allow.join(', ') } })
  }
  const { route, params } = match
  if (route.access !== 'public') {
    seen.identity ??= await caller(req, registry, rateLimit)
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
    headers: req.headers,
    body: () => (parsed ??= bodyWithin(flight, () => readJsonBody(req, maxBodyBytes, route.maxJsonDepth))),
  })
}

/** The error body for a failed request; logged when the fault is Paygate's or a dependency's, not the caller's. */
function failureReply(log: Logger, e: unknown, path: string, res: ServerResponse): Reply {
  const err = toPaygateError(e)
  if (err.code === 'internal_error') log.error({ err: e, path }, 'request failed')
  else if (err.code === 'unavailable' && err.cause !== undefined) log.warn({ err, path }, 'request failed: a dependency is not answering')
  if (err.code === 'payload_too_large') res.setHeader('connection', 'close')
  return errorJson(err)
}

/** The access line. Its fields are fixed and secret-free, so `access` is the unredacted logger (no redaction pass on the hot path). */
function logAccess(access: Logger, req: IncomingMessage, path: string, status: number, started: bigint, seen: Seen): void {
  const ms = Number(process.hrtime.bigint() - started) / 1e6
  access.info(
    {
      method: req.method,
      path,
      status,
      ms: Math.round(ms * 100) / 100,
      ...(seen.identity ? { keyId: seen.identity.keyId } : {}),
      ...(seen.identity?.kind === 'agent' ? { agentId: seen.identity.agentId } : {}),
    },
    'api request',
  )
}

/** Count a response in flight on its socket; the last one to close lets a waiting parser error be answered. */
function track(inFlight: WeakMap<Duplex, Flight>, req: IncomingMessage, res: ServerResponse): Flight {
  let flight = inFlight.get(req.socket)
  if (!flight) inFlight.set(req.socket, (flight = { responses: 0 }))
  const f = flight
  f.responses++
  res.once('close', () => {
    if (--f.responses === 0) f.refused?.()
  })
  return f
}

/** Answer a parser error once per socket, after the responses under way on it. */
function clientErrorHandler(inFlight: WeakMap<Duplex, Flight>): (e: NodeJS.ErrnoException, socket: Duplex) => void {
  /** Sockets whose parser error is answered already: the parser reports it again on every later chunk. */
  const refused = new WeakSet<Duplex>()
  return (e, socket) => {
    if (refused.has(socket)) return
    refused.add(socket)
    const flight = inFlight.get(socket)
    if (flight?.responses) {
      flight.refused = () => answerClientError(e, socket)
      // A body still on its way past the deadline: the handler reading it answers 408.
      if (e.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
        flight.timedOut = true
        flight.late?.()
      }
    } else answerClientError(e, socket)
  }
}

/** The /v1 API and health endpoints on one node:http server. */
export function createApiServer(deps: ApiDeps): Server {
  const { log, requestTimeoutMs } = deps
  const access = unredacted(log)
  const inFlight = new WeakMap<Duplex, Flight>()

  // requestTimeout bounds head and body together (headersTimeout follows it); the check runs each second.
  const server = createServer({ keepAliveTimeout: 65_000, requestTimeout: requestTimeoutMs, connectionsCheckingInterval: 1000 }, (req: IncomingMessage, res: ServerResponse) => {
    const started = process.hrtime.bigint()
    const flight = track(inFlight, req, res)
    let url: URL
    try {
      url = new URL(req.url ?? '/', 'http://api.local')
    } catch {
      sendReply(res, errorJson(new PaygateError('invalid_request', 'malformed request target', { extra: { field: 'path' } })))
      return
    }
    const seen: Seen = { identity: null }
    handle(deps, req, url, seen, flight)
      .then(
        (reply) => reply,
        (e: unknown) => failureReply(log, e, url.pathname, res),
      )
      .then((reply) => {
        if (!res.headersSent) sendReply(res, reply)
        logAccess(access, req, url.pathname, reply.status, started, seen)
      })
      .catch((e: unknown) => log.error({ err: e }, 'could not send reply'))
  })
  server.on('clientError', clientErrorHandler(inFlight))
  return server
}
