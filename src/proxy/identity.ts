import type { IncomingHttpHeaders } from 'node:http'
import type { Registry } from '../agents/registry.js'

const CACHE_MAX = 1024

/**
 * Who is asking: `Proxy-Authorization: Basic base64(agentId:agentKey)`, the key being one of
 * that agent's keys. Without credentials, the sidecar default agent when configured.
 * Every request carries the header, so answers are kept per header value (decoding and
 * hashing it cost ~5 µs); any key revocation or agent deletion in the registry clears them.
 */
export class ProxyIdentity {
  private readonly answers = new Map<string, string>()
  private revision: number

  constructor(
    private readonly registry: Registry,
    private readonly defaultAgent: string | null,
  ) {
    this.revision = registry.revision
  }

  /** As `of` when the answer is already known (the common case); undefined when it needs verifying. */
  known(headers: IncomingHttpHeaders): string | null | undefined {
    const raw = headers['proxy-authorization']
    if (!raw) return this.defaultAgent
    if (this.registry.revision !== this.revision) {
      this.answers.clear()
      this.revision = this.registry.revision
    }
    return this.answers.get(raw)
  }

  async of(headers: IncomingHttpHeaders): Promise<string | null> {
    const hit = this.known(headers)
    if (hit !== undefined) return hit
    const raw = headers['proxy-authorization']!
    const revision = this.revision
    const agentId = await this.verify(raw)
    // A revocation while verifying may have made this answer stale: keep it only if none came.
    if (agentId && this.registry.revision === revision) {
      if (this.answers.size >= CACHE_MAX) this.answers.delete(this.answers.keys().next().value!)
      this.answers.set(raw, agentId)
    }
    return agentId
  }

  private async verify(raw: string): Promise<string | null> {
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
    const id = await this.registry.verify(decoded.slice(i + 1))
    return id?.kind === 'agent' && id.agentId === agentId ? agentId : null
  }
}
