/** A secret is hidden on its own only from this length on: a shorter text would match ordinary words. */
export const MIN_HIDDEN_LENGTH = 8

/**
 * A URL as logs, error messages and the API show it. Hosted JSON-RPC providers put their
 * API key in the path (`/v3/<key>`), the query (`?apikey=`) or the userinfo, so a URL
 * carrying any of those is shown as its origin alone.
 */
export function shownUrl(url: string): string {
  let u: URL
  try {
    u = new URL(url)
  } catch {
    return '[redacted url]'
  }
  const bare = !u.username && !u.password && (u.pathname === '/' || u.pathname === '') && !u.search && !u.hash
  return bare ? url : `${u.protocol}//${u.host}/[redacted]`
}

/**
 * The texts of a URL to hide, each with what is shown instead: the URL as given, as `URL`
 * normalises it and without its userinfo (as viem's errors print it), and a long password
 * on its own. Empty for a URL with nothing to hide.
 */
export function urlSecrets(url: string): [text: string, shown: string][] {
  const shown = shownUrl(url)
  if (shown === url) return []
  const out = new Map([[url, shown]])
  try {
    const u = new URL(url)
    out.set(u.href, shown)
    if (u.password.length >= MIN_HIDDEN_LENGTH) out.set(decodeURIComponent(u.password), '[redacted]')
    u.username = ''
    u.password = ''
    out.set(u.href, shown)
  } catch {
    /* not a URL: the text as given is hidden */
  }
  return [...out]
}
