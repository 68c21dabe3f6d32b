/**
 * IP addresses as numbers, so that every spelling of one address is one address:
 * `127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1` and `::ffff:127.0.0.1` are all 127.0.0.1.
 * Pure; the egress decision (egress-decide.ts) compares targets with these.
 */

export type Ip = { v: 4; n: number } | { v: 6; n: bigint }

export interface Cidr {
  ip: Ip
  bits: number
}

const V4_PART = /^(0x[0-9a-f]+|0[0-7]*|[1-9][0-9]*)$/i

/**
 * IPv4 as inet_aton and the WHATWG URL parser read it: one to four parts, each decimal, hex
 * (`0x`) or octal (leading `0`), the last filling the remaining bytes (`127.1`, `2130706433`).
 */
export function parseIPv4(s: string): number | null {
  if (!s || s.length > 64) return null
  const parts = s.split('.')
  if (parts.length > 4) return null
  const nums: number[] = []
  for (const p of parts) {
    if (!V4_PART.test(p)) return null
    const n = p.length > 1 && (p[1] === 'x' || p[1] === 'X') ? parseInt(p.slice(2), 16) : p.length > 1 && p[0] === '0' ? parseInt(p, 8) : parseInt(p, 10)
    if (!Number.isSafeInteger(n)) return null
    nums.push(n)
  }
  const last = nums.pop()!
  for (const n of nums) if (n > 255) return null
  if (last >= 2 ** (8 * (4 - nums.length))) return null
  let out = 0
  for (let i = 0; i < nums.length; i++) out += nums[i]! * 2 ** (8 * (3 - i))
  return out + last
}

/** A dotted quad and nothing else (what an `egress.*` entry may use). */
export const STRICT_V4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/

export function parseIPv6(input: string): bigint | null {
  let s = input
  const zone = s.indexOf('%')
  if (zone >= 0) s = s.slice(0, zone)
  if (!s.includes(':') || s.length > 45) return null
  // An embedded dotted quad in the last 32 bits (::ffff:1.2.3.4) becomes two groups.
  const lastColon = s.lastIndexOf(':')
  const end = s.slice(lastColon + 1)
  if (end.includes('.')) {
    if (!STRICT_V4.test(end)) return null
    const n = parseIPv4(end)!
    s = `${s.slice(0, lastColon + 1)}${(n >>> 16).toString(16)}:${(n & 0xffff).toString(16)}`
  }
  const halves = s.split('::')
  if (halves.length > 2) return null
  const read = (h: string): number[] | null => {
    if (h === '') return []
    const out: number[] = []
    for (const g of h.split(':')) {
      if (!/^[0-9a-f]{1,4}$/i.test(g)) return null
      out.push(parseInt(g, 16))
    }
    return out
  }
  const head = read(halves[0]!)
  const rest = halves.length === 2 ? read(halves[1]!) : []
  if (!head || !rest) return null
  const count = head.length + rest.length
  if (halves.length === 1 ? count !== 8 : count > 7) return null
  const all = halves.length === 2 ? [...head, ...new Array<number>(8 - count).fill(0), ...rest] : head
  let n = 0n
  for (const g of all) n = (n << 16n) | BigInt(g)
  return n
}

/** The upper 96 bits of the IPv6 blocks that carry an IPv4 address: mapped (::ffff:0:0/96) and NAT64 (64:ff9b::/96). */
const MAPPED_HIGH = 0xffffn
const NAT64_HIGH = 0x64ff9b_0000_0000_0000_0000n

/**
 * An address in any spelling (brackets and a zone id allowed around IPv6), IPv6 that
 * carries an IPv4 address (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64
 * `64:ff9b::a.b.c.d`) as that IPv4 address. Null if not an address.
 */
export function parseIp(input: string): Ip | null {
  let s = input.trim().toLowerCase()
  if (s.startsWith('[') && s.endsWith(']')) s = s.slice(1, -1)
  if (s.endsWith('.')) s = s.slice(0, -1)
  const v4 = parseIPv4(s)
  if (v4 !== null) return { v: 4, n: v4 }
  const v6 = parseIPv6(s)
  if (v6 === null) return null
  return embeddedV4(v6) ?? { v: 6, n: v6 }
}

function embeddedV4(n: bigint): Ip | null {
  const high = n >> 32n
  const low = Number(n & 0xffffffffn)
  if (high === MAPPED_HIGH || high === NAT64_HIGH) return { v: 4, n: low }
  // IPv4-compatible (deprecated), but not :: and ::1.
  if (high === 0n && low > 1) return { v: 4, n: low }
  return null
}

export function formatIp(ip: Ip): string {
  if (ip.v === 4) return [ip.n >>> 24, (ip.n >>> 16) & 255, (ip.n >>> 8) & 255, ip.n & 255].join('.')
  const groups: number[] = []
  for (let i = 7; i >= 0; i--) groups.push(Number((ip.n >> BigInt(i * 16)) & 0xffffn))
  // RFC 5952: the longest run of two or more zero groups becomes `::`.
  let best = -1
  let bestLen = 1
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++
      continue
    }
    let j = i
    while (j < 8 && groups[j] === 0) j++
    if (j - i > bestLen) {
      best = i
      bestLen = j - i
    }
    i = j
  }
  const hex = (a: number[]): string => a.map((g) => g.toString(16)).join(':')
  return best < 0 ? hex(groups) : `${hex(groups.slice(0, best))}::${hex(groups.slice(best + bestLen))}`
}

export function inCidr(c: Cidr, ip: Ip): boolean {
  if (c.ip.v !== ip.v) return false
  if (ip.v === 4) return c.bits === 0 || (ip.n ^ (c.ip.n as number)) >>> (32 - c.bits) === 0
  const shift = BigInt(128 - c.bits)
  return ip.n >> shift === (c.ip.n as bigint) >> shift
}

export const sameIp = (a: Ip, b: Ip): boolean => a.v === b.v && a.n === b.n

export function cidr(text: string): Cidr {
  const [a, b] = text.split('/')
  const ip = parseIp(a!)!
  const bits = Number(b)
  // ::ffff:0:0/96 style entries arrive here as IPv4.
  return { ip, bits: ip.v === 4 && a!.includes(':') ? bits - 96 : bits }
}
