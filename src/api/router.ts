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
}

export type Match = { route: Route; params: Record<string, string> } | { allow: string[] } | null

export class Router {
  private readonly routes: Compiled[] = []

  add(...routes: Route[]): this {
    for (const r of routes) this.routes.push({ ...r, segments: r.path.split('/').filter(Boolean) })
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

  /** The route for a method and path; `{allow}` when the path exists under other methods. */
  match(method: string, pathname: string): Match {
    const parts = pathname.split('/').filter(Boolean)
    const allow: string[] = []
    for (const r of this.routes) {
      const params = matchSegments(r.segments, parts)
      if (!params) continue
      if (r.method === method) return { route: r, params }
      allow.push(r.method)
    }
    return allow.length ? { allow } : null
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
