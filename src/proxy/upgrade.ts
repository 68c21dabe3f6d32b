import type { IncomingMessage } from 'node:http'
import type { Socket } from 'node:net'
import httpProxy from 'http-proxy'
import { isEgressDenied, type EgressGuard } from '../net/egress.js'
import { cannotReach, notAbsolute, sendError } from './answers.js'
import type { ProxyContext } from './context.js'
import type { Tunnel } from './fast.js'
import { tunnelPath, tunnelTargetError } from './tunnel.js'

/** WebSocket upgrades (absolute-form, or inside a tunnel), relayed by http-proxy once the agent is known. */
export class Upgrades {
  private readonly ws = httpProxy.createProxyServer({ ws: true, xfwd: false })
  /** Bytes an upgrading socket had sent before the upgrade (a net.Socket's count; streams handed to Node's servers have none). */
  private readonly sent = new WeakMap<object, number>()

  constructor(private readonly ctx: ProxyContext) {
    this.ws.on('error', (err, _req, target) => {
      ctx.d.log.warn({ err: err.message }, 'websocket proxy error')
      if (!target || !('destroy' in target)) return
      const socket = target as Socket
      // Nothing sent to the agent since the upgrade began (the target never answered it): say so, as any failed send.
      const before = this.sent.get(socket)
      if (before !== undefined && socket.bytesWritten === before && socket.writable) void sendError(socket, cannotReach(err))
      else socket.destroy()
    })
  }

  async handle(req: IncomingMessage, socket: Socket, head: Buffer, tunnel: Tunnel | null): Promise<void> {
    socket.on('error', () => socket.destroy())
    const origin = tunnel ? await this.inTunnel(req, socket, tunnel) : await this.absolute(req, socket)
    if (origin === null) return
    // The target's connection resolves through the egress guard (http-proxy hands `ssl` to http.request as its base options).
    const dest = new URL(origin)
    let to: ReturnType<EgressGuard['connectOptions']>
    try {
      to = this.ctx.egress.connectOptions(dest.hostname.replace(/^\[|\]$/g, ''), Number(dest.port) || (dest.protocol === 'https:' ? 443 : 80))
    } catch (e) {
      if (!isEgressDenied(e)) throw e
      return sendError(socket, e)
    }
    delete req.headers['proxy-authorization']
    for (const k of Object.keys(req.headers)) if (k.startsWith('x-paygate-')) delete req.headers[k]
    if (typeof socket.bytesWritten === 'number') this.sent.set(socket, socket.bytesWritten)
    const ca = this.ctx.d.upstreamCa
    // `ca` is not in http-proxy's types; it hands its options to https.request, which takes it.
    const options = { target: origin, changeOrigin: true, secure: true, ssl: { lookup: to.lookup }, ...(ca ? { ca } : {}) }
    this.ws.ws(req, socket, head, options)
  }

  /** The tunnel's origin, with `req.url` made origin-form; null once answered (revoked, another host). */
  private async inTunnel(req: IncomingMessage, socket: Socket, tunnel: Tunnel): Promise<string | null> {
    const held = this.ctx.authorizeTunnel(tunnel)
    if (held !== true && !(await held)) {
      await this.ctx.deny(socket)
      return null
    }
    const path = tunnelPath(tunnel, req.url ?? '/')
    if (path === null) {
      await sendError(socket, tunnelTargetError(tunnel))
      return null
    }
    req.url = path
    return tunnel.origin
  }

  /** The absolute-form target's origin, with `req.url` made origin-form; null once answered. */
  private async absolute(req: IncomingMessage, socket: Socket): Promise<string | null> {
    const agentId = await this.ctx.identity.of(req.headers)
    if (!agentId) {
      await this.ctx.deny(socket)
      return null
    }
    try {
      const u = new URL(req.url ?? '')
      req.url = `${u.pathname}${u.search}`
      return `${u.protocol === 'wss:' || u.protocol === 'https:' ? 'https' : 'http'}://${u.host}`
    } catch {
      await sendError(socket, notAbsolute('ws://host/path'))
      return null
    }
  }

  close(): void {
    this.ws.close()
  }
}
