import { isIP } from 'node:net'
import type { Registry } from '../agents/registry.js'
import { PaygateError } from '../errors/index.js'
import type { Tunnel } from './fast.js'
import type { ProxyIdentity } from './identity.js'

/** `host:port` of a CONNECT target, IPv6 in brackets. */
export function splitAuthority(authority: string): { host: string; port: number } | null {
  const m = /^\[([^\]]+)\]:(\d{1,5})$/.exec(authority) ?? /^([^:]+):(\d{1,5})$/.exec(authority)
  if (!m) return null
  const port = Number(m[2])
  return port > 0 && port < 65536 ? { host: m[1]!.toLowerCase(), port } : null
}

const urlHost = (host: string): string => (isIP(host) === 6 ? `[${host}]` : host)

export function tunnelTo(agentId: string, auth: string | undefined, revision: number, scheme: 'http' | 'https', host: string, port: number): Tunnel {
  const authority = `${urlHost(host)}${port === (scheme === 'https' ? 443 : 80) ? '' : `:${port}`}`
  return { agentId, origin: `${scheme}://${authority}`, authority, dest: { https: scheme === 'https', host, port }, auth, revision }
}

/**
 * The path of a request inside a tunnel: origin-form as it is, absolute-form (which a server
 * MUST accept, RFC 9112 §3.2.2) only for the tunnel's own host and port. Null for anything
 * else (another host, `*`).
 */
export function tunnelPath(t: Tunnel, target: string): string | null {
  if (target.startsWith('/')) return target
  let u: URL
  let own: URL
  try {
    u = new URL(target)
    own = new URL(`http://${urlHost(t.dest.host)}`)
  } catch {
    return null
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return null
  const port = u.port ? Number(u.port) : u.protocol === 'https:' ? 443 : 80
  return u.hostname === own.hostname && port === t.dest.port ? u.pathname + u.search : null
}

export const tunnelTargetError = (t: Tunnel): PaygateError =>
  new PaygateError('invalid_request', `inside a tunnel to ${t.authority}, send origin-form requests (/path) or absolute-form ones for that host and port`, { extra: { field: 'request-target' } })

export function hostMatches(list: readonly string[], host: string): boolean {
  return list.some((e) => e === host || (e.startsWith('*.') && host.endsWith(e.slice(1))))
}

/**
 * A tunnel is authenticated at CONNECT; after any revocation since (the registry's revision
 * moved) its credential is verified again before the next request inside it. `true` without
 * an await while nothing moved: this runs per request on the fast path.
 */
export function authorizeTunnel(t: Tunnel, registry: Registry, identity: ProxyIdentity): true | Promise<boolean> {
  if (t.revision === registry.revision) return true
  return stillHolds(t, registry, identity)
}

async function stillHolds(t: Tunnel, registry: Registry, identity: ProxyIdentity): Promise<boolean> {
  const revision = registry.revision
  const agentId = await identity.of(t.auth === undefined ? {} : { 'proxy-authorization': t.auth })
  if (agentId !== t.agentId) return false
  t.revision = revision
  return true
}
