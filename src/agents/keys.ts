import { createHash, timingSafeEqual } from 'node:crypto'
import { randomBase62 } from '../util/random.js'

/**
 * API keys: a kind prefix plus 40 random base62 characters (~238 bits). They are
 * high-entropy, so a single SHA-256 is the right storage hash (a slow KDF buys nothing
 * and the proxy checks a key on every request).
 */
export const ACCOUNT_PREFIX = 'rp_live_'
export const AGENT_PREFIX = 'rp_agent_'
const SECRET_LENGTH = 40
const KEY_RE = /^(rp_live_|rp_agent_)([0-9A-Za-z]{32,128})$/

export type KeyKind = 'account' | 'agent'

export const newApiKey = (kind: KeyKind): string => (kind === 'account' ? ACCOUNT_PREFIX : AGENT_PREFIX) + randomBase62(SECRET_LENGTH)

export const newKeyId = (): string => `key_${randomBase62(16)}`

/** The kind a well-formed key claims by its prefix, or null when malformed. */
export function keyKindOf(key: string): KeyKind | null {
  const m = KEY_RE.exec(key)
  if (!m) return null
  return m[1] === ACCOUNT_PREFIX ? 'account' : 'agent'
}

export const hashKey = (key: string): string => createHash('sha256').update(key, 'utf8').digest('hex')

/** Constant-time comparison of two hex digests. */
export function sameHash(a: string, b: string): boolean {
  const x = Buffer.from(a, 'hex')
  const y = Buffer.from(b, 'hex')
  return x.length === y.length && x.length > 0 && timingSafeEqual(x, y)
}

/** What a listing may show of a key: its kind prefix and the first 4 secret characters. */
export const displayPrefix = (key: string): string => {
  const m = KEY_RE.exec(key)
  return m ? `${m[1]}${m[2]!.slice(0, 4)}` : ''
}
