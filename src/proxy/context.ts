import type { Socket } from 'node:net'
import type { Registry } from '../agents/registry.js'
import type { PaymentEngine } from '../engine/engine.js'
import type { Idempotency } from '../engine/idempotency.js'
import type { Upstream } from '../upstream/upstream.js'
import type { Logger } from '../log/index.js'
import type { EgressGuard } from '../net/egress.js'
import type { Sink } from './answers.js'
import type { CertificateAuthority } from './ca.js'
import type { Tunnel } from './fast.js'
import type { ProxyIdentity } from './identity.js'

export interface ProxyDeps {
  engine: PaymentEngine
  registry: Registry
  upstream: Upstream
  ca: CertificateAuthority
  idempotency: Idempotency
  log: Logger
  maxBufferBytes: number
  /** Deadline for a body being buffered (`proxy.bufferTimeoutMs`); default 30 s. */
  bufferTimeoutMs?: number
  defaultAgent: string | null
  passThrough: readonly string[]
  /** The info line per proxied request (default on). */
  accessLog?: boolean
  /** Extra CAs trusted for upstream TLS on WebSocket upgrades (the engine has its own). */
  upstreamCa?: string[]
  /** Keep-alive idle limit on agent connections, and the time a CONNECT tunnel may stay silent before its first byte (default 65 s, as Node's server). */
  idleTimeoutMs?: number
}

/** The counters the metrics export reads: requests, 407s, and tunnels open now. */
export interface ProxyCounters {
  requests: number
  authFailures: number
  tunnels: number
}

/** What the proxy's parts (CONNECT, upgrades, the two request paths) share: the ProxyServer provides it. */
export interface ProxyContext {
  readonly d: ProxyDeps
  readonly identity: ProxyIdentity
  /** The engine's egress guard (the upstream's): the proxy's own connections ask it too. */
  readonly egress: EgressGuard
  readonly counters: ProxyCounters
  readonly idleTimeoutMs: number
  /** The one 407 answer (counted as an auth failure, and logged with what is known of the request); `close`: a revoked tunnel ends with it. */
  deny(to: Sink, close?: boolean, method?: string, host?: string): Promise<void>
  /** True at once while nothing was revoked since the tunnel's credential was checked, else whether it still holds. */
  authorizeTunnel(t: Tunnel): true | Promise<boolean>
  /** Serve a connection on the fast path (a tunnel's requests too). */
  startFast(socket: Socket, tunnel: Tunnel | null, initial?: Buffer | null): void
}
