import type { IncomingHttpHeaders } from 'node:http'
import type { Registry } from '../agents/registry.js'

/**
 * Who is asking: `Proxy-Authorization: Basic base64(agentId:agentKey)`, the key being one of
 * that agent's keys. Without credentials, the sidecar default agent when configured.
 */
export async function proxyIdentity(registry: Registry, headers: IncomingHttpHeaders, defaultAgent: string | null): Promise<string | null> {
  const raw = headers['proxy-authorization']
  if (!raw) return defaultAgent
  const m = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(raw)
  if (!m) return null
  const decoded = Buffer.from(m[1]!, 'base64').toString('utf8')
  const i = decoded.indexOf(':')
  if (i <= 0) return null
  let agentId: string
  try {
    agentId = decodeURIComponent(decoded.slice(0, i))
  } catch {
    return null
  }
  const key = decoded.slice(i + 1)
  const id = await registry.verify(key)
  return id?.kind === 'agent' && id.agentId === agentId ? agentId : null
}
