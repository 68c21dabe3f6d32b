import type { IncomingHttpHeaders } from 'node:http'
import { connect as netConnect, type Socket } from 'node:net'
import { TLSSocket } from 'node:tls'
import { PaygateError } from '../errors/index.js'
import { isEgressDenied, type EgressGuard } from '../net/egress.js'
import { cannotReach, sendError } from './answers.js'
import type { ProxyContext } from './context.js'
import type { Tunnel } from './fast.js'
import { firstChunk } from './streams.js'
import { hostMatches, splitAuthority, tunnelTo } from './tunnel.js'

const ESTABLISHED = 'HTTP/1.1 200 Connection Established\r\n\r\n'
/** What intercepted TLS negotiates, in the server's order of preference. */
const ALPN = ['http/1.1', 'http/1.0']

/**
 * A CONNECT: the agent is identified, the target asked of the egress guard, then the tunnel
 * is either passed through untouched (hosts in `passThrough`) or served as the agent's
 * requests (TLS intercepted, or plain HTTP), told apart by the first byte.
 */
export async function onConnect(ctx: ProxyContext, authority: string, headers: IncomingHttpHeaders, socket: Socket, head: Buffer): Promise<void> {
  socket.on('error', () => socket.destroy())
  const target = splitAuthority(authority)
  if (!target) {
    await sendError(socket, new PaygateError('invalid_request', `CONNECT needs host:port, got ${JSON.stringify(authority.slice(0, 300))}`, { extra: { field: 'request-target' } }))
    return
  }
  // Read before verifying: a revocation meanwhile makes the tunnel's first request check again.
  const revision = ctx.d.registry.revision
  const agentId = await ctx.identity.of(headers)
  if (!agentId) return ctx.deny(socket, false, 'CONNECT', authority)
  // The guard refuses at once what it can decide without resolving (IP literals in any
  // spelling, metadata and denied names, localhost on Paygate's own ports); a pass-through
  // connection resolves through it, and every connection for an intercepted tunnel asks again.
  let to: ReturnType<EgressGuard['connectOptions']> | null = null
  try {
    if (hostMatches(ctx.d.passThrough, target.host)) to = ctx.egress.connectOptions(target.host, target.port)
    else ctx.egress.checkNow(target.host, target.port)
  } catch (e) {
    if (!isEgressDenied(e)) throw e
    return sendError(socket, e)
  }
  if (to) return passThrough(ctx, socket, { ...to, port: target.port }, head)
  socket.write(ESTABLISHED)
  countOpen(ctx, socket)
  const first = head.length ? head : await firstChunk(socket, ctx.idleTimeoutMs)
  if (!first) {
    socket.destroy()
    return
  }
  const auth = headers['proxy-authorization']
  if (first[0] === 0x16) intercept(ctx, socket, first, tunnelTo(agentId, auth, revision, 'https', target.host, target.port))
  else ctx.startFast(socket, tunnelTo(agentId, auth, revision, 'http', target.host, target.port), first)
}

/** An open tunnel, counted until its socket closes. */
function countOpen(ctx: ProxyContext, socket: Socket): void {
  ctx.counters.tunnels++
  socket.once('close', () => ctx.counters.tunnels--)
}

/** A tunnel to a pass-through host: bytes both ways, untouched. */
function passThrough(ctx: ProxyContext, socket: Socket, to: ReturnType<EgressGuard['connectOptions']> & { port: number }, head: Buffer): void {
  let open = false
  const up = netConnect(to, () => {
    open = true
    socket.write(ESTABLISHED)
    countOpen(ctx, socket)
    if (head.length) up.write(head)
    socket.pipe(up).pipe(socket)
    socket.resume()
    // Idle both ways for the limit: the tunnel closes, as an intercepted one does.
    const idle = (): void => {
      socket.destroy()
      up.destroy()
    }
    socket.setTimeout(ctx.idleTimeoutMs, idle)
    up.setTimeout(ctx.idleTimeoutMs, idle)
  })
  up.on('error', (e) => {
    // Once the tunnel is up, the agent's bytes are the target's: only closing can say it broke.
    if (!open) void sendError(socket, cannotReach(e))
    else socket.destroy()
  })
}

/** A TLS ClientHello: intercept with a leaf for the SNI name (or the CONNECT host, for IPs). */
function intercept(ctx: ProxyContext, socket: Socket, first: Buffer, tunnel: Tunnel): void {
  let secureContext: ReturnType<ProxyContext['d']['ca']['secureContextFor']>
  try {
    secureContext = ctx.d.ca.secureContextFor(tunnel.dest.host)
  } catch {
    socket.destroy()
    return
  }
  // TLSSocket hands what the socket holds to the TLS engine, then reads the native handle:
  // no JS stream in between (a Duplex here cost ~15% of intercepted keep-alive throughput).
  socket.unshift(first)
  // http/1.0 too: a client offering only it (curl --http1.0) is otherwise refused the handshake.
  const tls = new TLSSocket(socket, { isServer: true, secureContext, SNICallback: ctx.d.ca.sniCallback, ALPNProtocols: ALPN })
  tls.on('error', () => tls.destroy())
  ctx.startFast(tls, tunnel)
}
