import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { extname, join, relative, sep } from 'node:path'
import { fileURLToPath } from 'node:url'
import { PaygateError } from '../errors/index.js'
import type { Reply } from './router.js'

/**
 * The dashboard's static assets (built by `npm run build:web` into `dist/web`), served by the
 * API port under `/ui/`; `/` redirects there. Every file is read into memory once at start
 * and looked up by its exact relative path, so no request path can reach a file outside the
 * build (no `..`, no symlinks followed, no encoded separators): what is not in the table is 404.
 */

/** `src/api/` and `dist/api/` are both two levels below the package root. */
export const DEFAULT_DASHBOARD_DIR = fileURLToPath(new URL('../../dist/web/', import.meta.url))

export const DASHBOARD_PREFIX = '/ui/'

/** Only this origin: scripts, styles, images, fonts and API calls; no framing, no inline code. */
export const DASHBOARD_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "font-src 'self'",
  "connect-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ')

const SECURITY_HEADERS: Record<string, string> = {
  'content-security-policy': DASHBOARD_CSP,
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'referrer-policy': 'no-referrer',
  'cross-origin-opener-policy': 'same-origin',
}

const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.json': 'application/json; charset=utf-8',
  '.txt': 'text/plain; charset=utf-8',
  '.woff2': 'font/woff2',
}

interface Asset {
  data: Buffer
  contentType: string
  cacheControl: string
}

/** Regular files under `dir`, by relative path with `/` separators (symlinks are not followed). */
function readTree(dir: string, base = dir, out = new Map<string, Asset>()): Map<string, Asset> {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const full = join(dir, entry.name)
    if (entry.isDirectory()) readTree(full, base, out)
    else if (entry.isFile()) {
      const rel = relative(base, full).split(sep).join('/')
      const contentType = CONTENT_TYPES[extname(rel).toLowerCase()]
      if (!contentType) continue
      // Vite puts content-hashed names under assets/: they never change, so cache them for a year.
      const cacheControl = rel.startsWith('assets/') ? 'public, max-age=31536000, immutable' : 'no-cache'
      out.set(rel, { data: readFileSync(full), contentType, cacheControl })
    }
  }
  return out
}

export class DashboardAssets {
  private readonly files: Map<string, Asset>

  constructor(readonly dir: string = DEFAULT_DASHBOARD_DIR) {
    this.files = existsSync(dir) && statSync(dir).isDirectory() ? readTree(dir) : new Map()
  }

  get built(): boolean {
    return this.files.has('index.html')
  }

  /** Whether a path is the dashboard's (never `/v1/*`, `/metrics`, `/healthz`, `/readyz`). */
  static owns(pathname: string): boolean {
    return pathname === '/' || pathname === '/ui' || pathname.startsWith(DASHBOARD_PREFIX)
  }

  /** The answer for a dashboard path (see `owns`). */
  answer(method: string, pathname: string): Reply {
    if (method !== 'GET' && method !== 'HEAD') {
      throw new PaygateError('method_not_allowed', `${method} is not allowed on ${pathname}`, { headers: { allow: 'GET, HEAD' } })
    }
    if (pathname === '/' || pathname === '/ui') return { status: 302, headers: { location: DASHBOARD_PREFIX, ...SECURITY_HEADERS } }
    if (!this.built) throw new PaygateError('not_found', 'the dashboard is not built: run npm run build')
    const rel = pathname.slice(DASHBOARD_PREFIX.length) || 'index.html'
    const asset = this.files.get(rel)
    if (!asset) throw new PaygateError('not_found', `no such dashboard file: ${pathname}`)
    const headers = { ...SECURITY_HEADERS, 'cache-control': asset.cacheControl, 'content-length': String(asset.data.length) }
    return { status: 200, headers, raw: { contentType: asset.contentType, data: method === 'HEAD' ? Buffer.alloc(0) : asset.data } }
  }
}
