/**
 * HTTP/1.1 message heads and body framing for the proxy's keep-alive fast path (RFC 9112).
 * Pure: bytes in, parsed heads and message boundaries out. The fast path accepts a strict
 * subset; anything outside it (obs-fold, bare LF, odd framing) is reported as `null` so the
 * caller can hand the message to Node's own parser or to the general path instead.
 */

const CRLFCRLF = Buffer.from('\r\n\r\n')
/** Head larger than this: not the fast path's business (Node's parser answers 431). */
export const MAX_HEAD = 16 * 1024

/** RFC 9110 token characters (methods, field names). */
export const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
/** A character an RFC 9110 field value may not hold as undici sends it (visible ASCII, space, tab and obs-text 0x80-0xFF are allowed). */
export const BAD_FIELD_VALUE_CHAR = /[^\t\x20-\x7e\x80-\xff]/

/** 1 for each RFC 9110 tchar (field names), by char code. */
const TCHAR = new Uint8Array(128)
for (const c of "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") TCHAR[c.charCodeAt(0)] = 1

/** Where the head ends (the index after CRLFCRLF), -1 if not yet complete. */
export function headEnd(buf: Buffer, from = 0): number {
  const i = buf.indexOf(CRLFCRLF, from)
  return i < 0 ? -1 : i + 4
}

export interface Fields {
  /** [name, value, name, value, ...] as received. */
  raw: string[]
  /** The names of `raw` in lower case, in the same order. */
  names: string[]
  /** Lower-case name -> value; repeated fields joined with ", " (set-cookie kept as an array). */
  map: Record<string, string | string[]>
}

/**
 * The field lines of a head, from `from` to the end of `text` (the head as latin1 without
 * its final CRLFCRLF), in one pass over the characters: a token name, a colon, a value of
 * visible ASCII, obs-text, SP and HTAB with its SP/HTAB edges dropped, CRLF. Anything else
 * (obs-fold, bare CR or LF, NUL, space before the colon) is null. A profile showed the
 * split-and-regex version of this among the proxy's larger JavaScript costs.
 */
function parseFields(text: string, from: number): Fields | null {
  const raw: string[] = []
  const names: string[] = []
  const map: Record<string, string | string[]> = {}
  const n = text.length
  let i = from
  while (i < n) {
    const ns = i
    let upper = false
    let c = text.charCodeAt(i)
    while (c < 128 && TCHAR[c] === 1) {
      if (c <= 90 && c >= 65) upper = true
      c = text.charCodeAt(++i)
    }
    if (i === ns || c !== 58) return null
    const name = text.slice(ns, i)
    i++
    while ((c = text.charCodeAt(i)) === 32 || c === 9) i++
    const vs = i
    let ve = i
    for (; i < n; i++) {
      c = text.charCodeAt(i)
      if (c === 13) break
      if ((c < 32 && c !== 9) || c === 127) return null
      if (c !== 32 && c !== 9) ve = i + 1
    }
    if (i < n) {
      if (text.charCodeAt(i + 1) !== 10) return null
      i += 2
      // A CRLF must start another field here (the head's text ends before its last CRLF).
      if (i === n) return null
    }
    const value = text.slice(vs, ve)
    const k = upper ? name.toLowerCase() : name
    raw.push(name, value)
    names.push(k)
    const prev = map[k]
    if (prev === undefined) map[k] = k === 'set-cookie' ? [value] : value
    else if (Array.isArray(prev)) prev.push(value)
    else map[k] = `${prev}, ${value}`
  }
  return { raw, names, map }
}

/** The head in `buf[0..end)` as latin1 without its final CRLFCRLF, its start line, and where its fields begin. */
function headText(buf: Buffer, end: number): [text: string, first: string, from: number] {
  const text = buf.toString('latin1', 0, end - 4)
  const eol = text.indexOf('\r\n')
  return eol < 0 ? [text, text, text.length] : [text, text.slice(0, eol), eol + 2]
}

export interface RequestHead extends Fields {
  method: string
  target: string
  /** Bytes the head took. */
  size: number
}

/** An HTTP/1.1 request head in `buf[0..end)`; null when it is outside the fast path's subset. */
export function parseRequestHead(buf: Buffer, end: number): RequestHead | null {
  const [text, first, from] = headText(buf, end)
  const a = first.indexOf(' ')
  const b = first.indexOf(' ', a + 1)
  if (a <= 0 || b <= a + 1 || first.slice(b + 1) !== 'HTTP/1.1') return null
  const method = first.slice(0, a)
  const target = first.slice(a + 1, b)
  // biome-ignore lint/suspicious/noControlCharactersInRegex: a request target may not hold control characters (RFC 9112 §3.2)
  if (!TOKEN.test(method) || /[\s\x00-\x1f\x7f]/.test(target)) return null
  const f = parseFields(text, from)
  return f && { method, target, size: end, raw: f.raw, names: f.names, map: f.map }
}

export interface ResponseHead extends Fields {
  /** 0 for HTTP/1.0, 1 for HTTP/1.1. */
  minor: number
  status: number
  reason: string
  size: number
}

export function parseResponseHead(buf: Buffer, end: number): ResponseHead | null {
  const [text, first, from] = headText(buf, end)
  const m = /^HTTP\/1\.([01]) ([1-9]\d\d)(?: ([\t\x20-\x7e\x80-\xff]*))?$/.exec(first)
  if (!m) return null
  const f = parseFields(text, from)
  return f && { minor: Number(m[1]), status: Number(m[2]), reason: m[3] ?? '', size: end, raw: f.raw, names: f.names, map: f.map }
}

/** How a response body is delimited. */
export type Framing = { kind: 'none' } | { kind: 'length'; length: number } | { kind: 'chunked' } | { kind: 'close' }

/**
 * A response's framing (RFC 9112 §6.3), or null when the fast path leaves it alone:
 * 1xx, transfer codings other than plain chunked, CL+TE, or a Content-Length that is not
 * one plain number. Neither field: the body runs until the connection closes.
 */
export function responseFraming(head: ResponseHead, method: string): Framing | null {
  const { status, map } = head
  if (status < 200) return null
  if (method === 'HEAD' || status === 204 || status === 304) return { kind: 'none' }
  const te = map['transfer-encoding']
  const cl = map['content-length']
  if (te !== undefined) return cl === undefined && typeof te === 'string' && te.toLowerCase() === 'chunked' ? { kind: 'chunked' } : null
  if (cl === undefined) return { kind: 'close' }
  if (typeof cl !== 'string' || !/^\d{1,15}$/.test(cl)) return null
  return { kind: 'length', length: Number(cl) }
}

/**
 * Finds where a body ends. `feed` returns the index in `chunk` just past the body's last
 * byte, or -1 when the body goes on; it throws on a malformed chunked body. With `decode`,
 * a chunked body's data (without its framing) is collected in `decoded` as it is found;
 * without, the bytes are meant to be forwarded as they are.
 */
export class BodyFramer {
  private remaining: number
  /** chunked: 0 size line, 1 data, 2 CRLF after data, 3 trailer lines */
  private state = 0
  private line = ''
  /** With `decode`: the chunked data found by the last `feed`s (the caller empties it). */
  readonly decoded: Buffer[] = []

  constructor(
    private readonly framing: Framing,
    readonly decoding = false,
  ) {
    this.remaining = framing.kind === 'length' ? framing.length : 0
  }

  /** True once the whole body has been seen. */
  done = false

  /** The body ends when the connection does. */
  get closeDelimited(): boolean {
    return this.framing.kind === 'close'
  }

  feed(chunk: Buffer, from = 0): number {
    if (this.done) return from
    if (this.framing.kind === 'none') {
      this.done = true
      return from
    }
    if (this.framing.kind === 'close') return -1 // ends with the connection
    if (this.framing.kind === 'length') {
      const avail = chunk.length - from
      if (avail < this.remaining) {
        this.remaining -= avail
        return -1
      }
      this.done = true
      return from + this.remaining
    }
    return this.chunked(chunk, from)
  }

  private chunked(chunk: Buffer, from: number): number {
    let i = from
    while (i < chunk.length) {
      if (this.state === 1) {
        const take = Math.min(this.remaining, chunk.length - i)
        if (this.decoding) this.decoded.push(chunk.subarray(i, i + take))
        i += take
        this.remaining -= take
        if (this.remaining === 0) this.state = 2
        continue
      }
      // size line, CRLF after data, trailer lines: read up to LF
      const lf = chunk.indexOf(0x0a, i)
      const end = lf < 0 ? chunk.length : lf + 1
      this.line += chunk.toString('latin1', i, end)
      i = end
      if (this.line.length > 4096) throw new Error('chunk line too long')
      if (lf < 0) break
      const line = this.line
      this.line = ''
      if (!line.endsWith('\r\n')) throw new Error('bare LF in chunked body')
      const text = line.slice(0, -2)
      if (this.state === 2) {
        if (text !== '') throw new Error('chunk data longer than its size')
        this.state = 0
      } else if (this.state === 0) {
        const m = /^([0-9A-Fa-f]{1,12})(?:[ \t]*;.*)?$/.exec(text)
        if (!m) throw new Error('bad chunk size')
        const size = parseInt(m[1]!, 16)
        if (size === 0) this.state = 3
        else {
          this.remaining = size
          this.state = 1
        }
      } else if (text === '') {
        this.done = true
        return i
      }
    }
    return -1
  }
}

/** RFC 9110 §7.6.1 hop-by-hop fields, plus the proxy's own credentials. */
export const HOP_BY_HOP: ReadonlySet<string> = new Set(['connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade'])

const NONE: ReadonlySet<string> = new Set()

/** Fields listed in Connection are hop-by-hop too (usually there is none, or just keep-alive). */
export function connectionTokens(c: string | string[] | undefined): ReadonlySet<string> {
  if (c === undefined) return NONE
  const s = Array.isArray(c) ? c.join(',') : c
  if (s.length === 0 || s === 'keep-alive' || s === 'close') return NONE
  return new Set(
    s
      .split(',')
      .map((x) => x.trim().toLowerCase())
      .filter(Boolean),
  )
}

/** Does the Connection field carry `token` (e.g. "close")? */
export function hasConnectionToken(c: string | string[] | undefined, token: string): boolean {
  if (c === undefined) return false
  const s = Array.isArray(c) ? c.join(',') : c
  return (
    s === token ||
    s
      .toLowerCase()
      .split(',')
      .some((x) => x.trim() === token)
  )
}

/**
 * The head sent on to the agent: status line and end-to-end fields as received. The body
 * goes on in its own framing, so Transfer-Encoding: chunked stays.
 */
export function relayResponseHead(head: ResponseHead, close: boolean): string {
  const drop = connectionTokens(head.map.connection)
  let out = `HTTP/1.1 ${head.status} ${head.reason}\r\n`
  const { raw, names } = head
  for (let i = 0; i < names.length; i++) {
    const k = names[i]!
    if ((HOP_BY_HOP.has(k) && k !== 'transfer-encoding') || drop.has(k)) continue
    out += `${raw[2 * i]}: ${raw[2 * i + 1]}\r\n`
  }
  return `${out}${close ? 'connection: close\r\n' : ''}\r\n`
}

export interface HttpTarget {
  /** As `new URL(target).href`. */
  href: string
  /** `host[:port]`, the port only when not 80 (as URL.host). */
  authority: string
  hostname: string
  port: number
  /** Path and query (origin-form). */
  path: string
}

const ABS_HTTP = /^http:\/\/([A-Za-z0-9.-]+)(?::([1-9]\d{0,4}))?(\/[A-Za-z0-9\-._~!$&()*+,;=:@/%?]*)?$/
const DNS_NAME = /^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*\.?$/
const DOTTED_QUAD = /^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/
/** A last label WHATWG URL would read as (part of) an IPv4 address. */
const NUMERIC_LABEL = /(?:^|\.)(?:\d+|0x[0-9a-f]*)\.?$/
/** Dot segments, plain or percent-encoded, which URL would resolve. */
const DOT_SEGMENT = /(?:^|\/)(?:\.|%2e){1,2}(?:\/|$)/i

/**
 * An absolute-form `http://` target read without `new URL` (a parse per proxied request
 * showed in the profile), for the common shapes whose URL serialization is the input
 * itself: a DNS name or dotted quad, a plain port, a path of URL-safe characters without
 * dot segments. Anything else returns null (see `httpTarget`).
 */
export function simpleHttpTarget(target: string): HttpTarget | null {
  const m = ABS_HTTP.exec(target)
  if (!m) return null
  const hostname = m[1]!.toLowerCase()
  if (!DNS_NAME.test(hostname) || (NUMERIC_LABEL.test(hostname) && !DOTTED_QUAD.test(hostname))) return null
  const port = m[2] ? Number(m[2]) : 80
  if (port > 65535) return null
  const path = m[3] ?? '/'
  const q = path.indexOf('?')
  // An empty query ("/x?") is kept by href but not by pathname + search: leave it to URL.
  if (q === path.length - 1 || DOT_SEGMENT.test(q < 0 ? path : path.slice(0, q))) return null
  const authority = port === 80 ? hostname : `${hostname}:${port}`
  return { href: `http://${authority}${path}`, authority, hostname, port, path }
}

/** An absolute-form `http://` target: the direct reading when it applies, else WHATWG URL; null if it is not one. */
export function httpTarget(target: string): HttpTarget | null {
  const simple = simpleHttpTarget(target)
  if (simple) return simple
  let u: URL
  try {
    u = new URL(target)
  } catch {
    return null
  }
  if (u.protocol !== 'http:') return null
  const hostname = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname
  return { href: u.href, authority: u.host, hostname, port: u.port ? Number(u.port) : 80, path: u.pathname + u.search }
}
