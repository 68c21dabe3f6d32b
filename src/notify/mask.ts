import { invalid } from '../errors/index.js'
import type { Channel } from './model.js'

const SECRET_PARAM = /token|key|secret|sig|auth|pass|code|hash/i

/**
 * A notification URL as the API shows it. A Slack incoming-webhook URL is its own secret
 * (whoever has it can post), so only its origin is shown; any other URL keeps its host and
 * path, with a password and query values whose names look like credentials replaced, and a
 * path segment that looks like a token (24+ characters of letters, digits, `-` or `_`) too.
 */
export function maskUrl(url: string, slack = false): string {
  let u: URL
  try {
    u = new URL(url)
  } catch {
    return '***'
  }
  if (slack || u.hostname === 'hooks.slack.com') return `${u.protocol}//${u.host}/***`
  if (u.password) u.password = '***'
  for (const [k] of [...u.searchParams]) if (SECRET_PARAM.test(k)) u.searchParams.set(k, '***')
  u.pathname = u.pathname
    .split('/')
    .map((s) => (/^[A-Za-z0-9_-]{24,}$/.test(s) ? '***' : s))
    .join('/')
  return u.toString().replaceAll('%2A%2A%2A', '***')
}

export function maskChannel(c: Channel): Channel {
  if (c.type === 'email') return c
  return { type: c.type, url: maskUrl(c.url, c.type === 'slack') }
}

/**
 * Refuse a URL that still holds the mask (`***`, or its percent-encoding) of a URL the API
 * showed: stored as sent, deliveries would go to the literal `***` instead of the secret.
 */
export function refuseMasked(field: string, url: unknown): void {
  if (typeof url === 'string' && /\*\*\*|%2a%2a%2a/i.test(url)) {
    throw invalid(field, `${field} still holds *** where the API masks a secret; send the full URL`)
  }
}

/** The URL of a `notify` object as a request sent it, if any. */
export const sentUrl = (notify: unknown): unknown => (typeof notify === 'object' && notify !== null ? (notify as Record<string, unknown>).url : undefined)
