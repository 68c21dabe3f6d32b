import type { IncomingHttpHeaders } from 'node:http'
import type { Identity } from '../agents/registry.js'
import { PaygateError } from '../errors/index.js'

/**
 * `public`: no key. `account`: account key only (agent keys get 403). `agent`: an account
 * key or an agent key; the handler checks that an agent key only touches its own agent.
 */
export type Access = 'public' | 'account' | 'agent'

export interface Reply {
  status: number
  body?: unknown
  headers?: Record<string, string>
  /** Raw (non-JSON) body with its content type, e.g. the CA certificate. */
  raw?: { contentType: string; data: string | Buffer }
}

export interface RouteCtx {
  url: URL
  params: Record<string, string>
  identity: Identity | null
  /** The request's headers (lower-case names). */
  headers: IncomingHttpHeaders
  /** The parsed JSON body (`{}` when empty). */
  body(): Promise<unknown>
}

export interface Route {
  method: string
  path: string
  access: Access
  /** How deeply the JSON body may nest (default MAX_JSON_DEPTH). */
  maxJsonDepth?: number
  handler(ctx: RouteCtx): Promise<Reply>
}

interface Compiled extends Route {
  segments: string[]
  /** One character per segment, '1' literal and '0' parameter: the greater, the more specific. */
  literal: string
}

export type Match = { route: Route; params: Record<string, string> } | { allow: string[] } | null

export class Router {
  private readonly routes: Compiled[] = []

  add(...routes: Route[]): this {
    for (const r of routes) {
      const segments = r.path.split('/').filter(Boolean)
      this.routes.push({ ...r, segments, literal: segments.map((p) => (p.startsWith(':') ? '0' : '1')).join('') })
    }
    return this
  }

  /** Every route as added: method, path (`:param` segments) and access. */
  list(): { method: string; path: string; access: Access }[] {
    return this.routes.map(({ method, path, access }) => ({ method, path, access }))
  }

  /** Whether some route on this path is public (`/v1/ca.pem`): its other methods answer 405 without a key. */
  isPublicPath(pathname: string): boolean {
    const parts = pathname.split('/').filter(Boolean)
    return this.routes.some((r) => r.access === 'public' && sameShape(r.segments, parts))
  }

  /**
   * The route for a method and path; `{allow}` when the path exists under other methods. A path
   * a literal pattern names belongs to it alone (`/v1/agents/invoke` is not `/v1/agents/:agentId`
   * with the id `invoke`): only the most specific patterns that match it count, for the route
   * and for the Allow list.
   */
  match(method: string, pathname: string): Match {
    const parts = pathname.split('/').filter(Boolean)
    let allow: string[] = []
    let best = ''
    let found: { route: Route; params: Record<string, string> } | null = null
    for (const r of this.routes) {
      if (r.literal < best || r.segments.length !== parts.length) continue
      const params = matchSegments(r.segments, parts)
      if (!params) continue
      if (r.literal > best) {
        best = r.literal
        allow = []
        found = null
      }
      if (r.method === method) found ??= { route: r, params }
      allow.push(r.method)
    }
    return found ?? (allow.length ? { allow } : null)
  }
}

/** Whether a path has a pattern's shape (literal segments equal), without decoding its parameters. */
const sameShape = (pattern: string[], parts: string[]): boolean => pattern.length === parts.length && pattern.every((p, i) => p.startsWith(':') || p === parts[i])

function matchSegments(pattern: string[], parts: string[]): Record<string, string> | null {
  if (pattern.length !== parts.length) return null
  const params: Record<string, string> = {}
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i]!
    const v = parts[i]!
    if (p.startsWith(':')) {
      try {
        params[p.slice(1)] = decodeURIComponent(v)
      } catch {
        throw new PaygateError('invalid_request', `path segment ${JSON.stringify(v)} is not valid percent-encoding`, { extra: { field: p.slice(1) } })
      }
    } else if (p !== v) return null
  }
  return params
}

/** Agent keys may only act on their own agent. */
export function requireAgentAccess(identity: Identity | null, agentId: string): void {
  if (identity?.kind === 'agent' && identity.agentId !== agentId) {
    throw new PaygateError('forbidden', "an agent key may only access its own agent's resources")
  }
}
