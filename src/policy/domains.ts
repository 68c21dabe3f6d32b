import { isIP } from 'node:net'
import { parse } from 'tldts'
import { remembered } from '../util/lru.js'

/**
 * Domain lists (tldts lives only here). An entry that is a registrable domain
 * (`example.co.uk`, by the Public Suffix List, private section included) or a public
 * suffix matches itself and every subdomain; a longer host (`api.example.com`),
 * `localhost` or an IP literal matches only itself.
 */
const LABEL = '[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?'
const HOST_RE = new RegExp(`^(?=.{1,253}$)${LABEL}(\\.${LABEL})*$`)

/** An IPv4-mapped IPv6 address (canonical `::ffff:7f00:1`) is its IPv4 address: the same host, one spelling. */
function unmapped(v6: string): string {
  const m = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(v6)
  if (!m) return v6
  const n = parseInt(m[1]!, 16) * 65536 + parseInt(m[2]!, 16)
  return `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`
}

/**
 * Canonical host: lower case, punycode, no trailing dot, IPv6 without brackets, IPv4-mapped
 * IPv6 as IPv4 (`[::ffff:127.0.0.1]` is 127.0.0.1). Null if not a
 * host. What the URL parser would rewrite into another host is refused, not stored as that
 * host: `\` (read as `/`), `%` escapes, and IPv4 in any form but four decimal octets
 * (`123` would be 0.0.0.123, `1.2.3` 1.2.0.3, `010.0.0.1` 8.0.0.1).
 */
export function normalizeHost(input: string): string | null {
  let h = input.trim()
  if (!h || /[\s/\\?#@%]/.test(h)) return null
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1)
  if (isIP(h) === 6) {
    try {
      return unmapped(new URL(`http://[${h}]/`).hostname.slice(1, -1))
    } catch {
      return null
    }
  }
  if (h.includes(':')) return null
  h = h.replace(/\.$/, '')
  let ascii: string
  try {
    ascii = new URL(`http://${h}/`).hostname
  } catch {
    return null
  }
  if (isIP(ascii) === 4) return isIP(h) === 4 ? ascii : null
  return HOST_RE.test(ascii) ? ascii : null
}

/** Whether an entry (already normalised) covers its subdomains too. */
export function coversSubdomains(entry: string): boolean {
  if (isIP(entry) || entry === 'localhost') return false
  const p = parse(entry, { allowPrivateDomains: true })
  // Registrable domain itself, or a bare public suffix.
  return p.domain === entry || (p.domain === null && p.publicSuffix === entry)
}

export function matchesEntry(entry: string, host: string): boolean {
  if (host === entry) return true
  // An entry stored before mapped addresses were written as IPv4.
  if (entry.startsWith('::ffff:')) return unmapped(entry) === host
  // The suffix test first: coversSubdomains parses the entry with the Public Suffix List.
  return host.endsWith(`.${entry}`) && coversSubdomains(entry)
}

export const matchesAny = (entries: readonly string[], host: string): boolean => entries.some((e) => matchesEntry(e, host))

/** The normalised host of a URL, as policies match it (two URL parses: remembered per URL). */
export const domainOf = remembered((url: string): string => {
  const host = new URL(url).hostname
  return normalizeHost(host) ?? host.toLowerCase()
})
