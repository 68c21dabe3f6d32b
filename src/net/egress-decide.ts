/**
 * Where an agent's traffic may go: a pure decision over plain data (the target as named and
 * the addresses it resolved to, Paygate's own listeners, the operator's `egress.allow` and
 * `egress.deny`). The guard (egress.ts) resolves names and feeds this; tests drive it directly.
 *
 * Addresses are compared as numbers, so every spelling of one address is one address:
 * `127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1` and `::ffff:127.0.0.1` are all 127.0.0.1.
 */

export type Ip = { v: 4; n: number } | { v: 6; n: bigint }

export interface Cidr {
  ip: Ip
  bits: number
}

export interface PortRange {
  from: number
  to: number
}

/** An `egress.allow` / `egress.deny` entry: a CIDR (or one address) or a host name, optionally for some ports only. */
export type Rule = { kind: 'cidr'; net: Cidr; ports: PortRange | null; text: string } | { kind: 'name'; name: string; subdomains: boolean; ports: PortRange | null; text: string }

export interface EgressRules {
  allow: readonly Rule[]
  deny: readonly Rule[]
}

/** What the guard knows of the host it runs on. */
export interface LocalView {
  /** Ports of Paygate's own listeners (API, proxy, the embedded chain's RPC), as bound. */
  ownPorts: ReadonlySet<number>
  /** Addresses of this host's interfaces. */
  ownAddresses: readonly Ip[]
}

export interface Target {
  /** The name asked for (canonical: lower case, no trailing dot), or null for an IP literal. */
  name: string | null
  port: number
  /** What the name resolved to (the literal itself for an IP). */
  addresses: readonly Ip[]
  /** An operator-configured target (a notification URL): only the always-denied list and `egress.deny` apply. */
  operator?: boolean
}

export type DenyReason = 'metadata' | 'link_local' | 'own_listener' | 'deny_list' | 'private' | 'reserved'

export type Verdict =
  | { allowed: true; by: 'allow_list' | 'operator' | 'default' }
  | {
      allowed: false
      reason: DenyReason
      /** Denied whatever the configuration (`egress.allow` cannot open it). */
      always: boolean
      /** The address that was refused (for the log), when an address decided. */
      address?: string
      /** The range or entry that matched. */
      match: string
    }

/**
 * The documented order of the checks; the first that denies decides. The first three are
 * always applied; `deny_list` applies to every target; an operator's target stops there,
 * an agent's goes on to `egress.allow`, then the default-denied ranges.
 */
export const CHECK_ORDER: readonly DenyReason[] = ['metadata', 'link_local', 'own_listener', 'deny_list', 'private', 'reserved']

// ---- addresses ---------------------------------------------------------------------------

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
const STRICT_V4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/

function parseIPv6(input: string): bigint | null {
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

const sameIp = (a: Ip, b: Ip): boolean => a.v === b.v && a.n === b.n

function cidr(text: string): Cidr {
  const [a, b] = text.split('/')
  const ip = parseIp(a!)!
  const bits = Number(b)
  // ::ffff:0:0/96 style entries arrive here as IPv4.
  return { ip, bits: ip.v === 4 && a!.includes(':') ? bits - 96 : bits }
}

const ranges = (list: readonly string[]): { net: Cidr; text: string }[] => list.map((text) => ({ net: cidr(text), text }))

/** Link-local: where cloud metadata services live (169.254.169.254, fe80::/10). */
const LINK_LOCAL = ranges(['169.254.0.0/16', 'fe80::/10'])
/** Metadata services outside link-local: AWS over IPv6, Alibaba Cloud. */
const METADATA_ADDRESSES = ranges(['fd00:ec2::254/128', '100.100.100.200/32'])
/** Names of cloud metadata services (and their short forms on the providers' resolvers). */
export const METADATA_NAMES: ReadonlySet<string> = new Set([
  'metadata',
  'metadata.google.internal',
  'metadata.goog',
  'instance-data',
  'instance-data.ec2.internal',
  'metadata.azure.internal',
  'metadata.tencentyun.com',
  'metadata.platformequinix.com',
])
/** This host itself, whatever the port: loopback and the unspecified address (which Linux connects to loopback). */
const LOCAL = ranges(['127.0.0.0/8', '0.0.0.0/8', '::1/128', '::/128'])
export const PRIVATE = ranges(['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', 'fc00::/7'])
/** Not a unicast host: multicast, the reserved class E block with broadcast, IPv6 multicast. */
export const RESERVED = ranges(['224.0.0.0/4', '240.0.0.0/4', 'ff00::/8'])

/** Denied unless `egress.allow` lists them, in check order. */
const DEFAULT_DENIED = [
  ['private', PRIVATE],
  ['reserved', RESERVED],
] as const

const firstRange = (list: readonly { net: Cidr; text: string }[], ip: Ip): string | null => {
  for (const r of list) if (inCidr(r.net, ip)) return r.text
  return null
}

/** `localhost` and `*.localhost` are loopback by definition (RFC 6761), whatever a resolver says. */
export const isLocalhostName = (name: string): boolean => name === 'localhost' || name.endsWith('.localhost')

// ---- rules ---------------------------------------------------------------------------------

const NAME = /^(\*\.)?(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$/

function parsePorts(s: string): PortRange | null {
  const m = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(s)
  if (!m) return null
  const from = Number(m[1])
  const to = m[2] === undefined ? from : Number(m[2])
  return from >= 1 && to <= 65535 && from <= to ? { from, to } : null
}

/**
 * One `egress.allow` / `egress.deny` entry, or why it is not one. Forms: `10.0.0.0/8`,
 * `10.1.2.3`, `fc00::/7`, `::1`, `api.internal`, `*.internal` (subdomains only), each
 * optionally with `:port` or `:from-to` (IPv6 in brackets then: `[fc00::/7]:443`).
 */
export function parseRule(input: string): Rule | string {
  const text = input.trim().toLowerCase()
  const what = 'a CIDR (10.0.0.0/8, fc00::/7), an IP address, or a host name (api.internal, *.internal), optionally with :port or :from-to ([::1]:8080 for IPv6)'
  let body = text
  let ports: PortRange | null = null
  const bracket = /^\[([^\]]+)\](?::(.+))?$/.exec(text)
  if (bracket) {
    body = bracket[1]!
    if (bracket[2] !== undefined) {
      ports = parsePorts(bracket[2])
      if (!ports) return `${input}: the port must be 1-65535 or a range from-to`
    }
    if (!body.includes(':')) return `${input}: brackets are for IPv6 only`
  } else if (text.split(':').length === 2) {
    const i = text.indexOf(':')
    body = text.slice(0, i)
    ports = parsePorts(text.slice(i + 1))
    if (!ports) return `${input}: the port must be 1-65535 or a range from-to`
  }
  if (body.includes('/')) {
    const [a, b, extra] = body.split('/')
    if (extra !== undefined || !/^\d{1,3}$/.test(b!)) return `${input} is not ${what}`
    const isV6 = a!.includes(':')
    if (!isV6 && !STRICT_V4.test(a!)) return `${input}: write the network as a dotted quad (10.0.0.0/8)`
    if (isV6 && parseIPv6(a!) === null) return `${input} is not ${what}`
    const bits = Number(b)
    if (bits > (isV6 ? 128 : 32)) return `${input}: the prefix length is at most ${isV6 ? 128 : 32}`
    const net = cidr(`${a}/${bits}`)
    if (net.bits < 0) return `${input}: a prefix over IPv4 carried in IPv6 is at least /96`
    const { ip } = net
    const masked = ip.v === 4 ? (net.bits === 0 ? 0 : ((ip.n >>> (32 - net.bits)) << (32 - net.bits)) >>> 0) : (ip.n >> BigInt(128 - net.bits)) << BigInt(128 - net.bits)
    if (masked !== ip.n) return `${input}: bits are set past the prefix length (the network is ${formatIp({ v: ip.v, n: masked } as Ip)}/${net.bits})`
    return { kind: 'cidr', net, ports, text }
  }
  if (body.includes(':')) {
    if (parseIPv6(body) === null) return `${input} is not ${what}`
    const ip = parseIp(body)!
    return { kind: 'cidr', net: { ip, bits: ip.v === 4 ? 32 : 128 }, ports, text }
  }
  if (STRICT_V4.test(body)) return { kind: 'cidr', net: { ip: parseIp(body)!, bits: 32 }, ports, text }
  if (parseIPv4(body) !== null) return `${input}: write an IPv4 address as a dotted quad (127.0.0.1)`
  const name = body.replace(/\.$/, '')
  if (!NAME.test(name)) return `${input} is not ${what}`
  return name.startsWith('*.') ? { kind: 'name', name: name.slice(2), subdomains: true, ports, text } : { kind: 'name', name, subdomains: false, ports, text }
}

/** Parse a list of entries (config already validated them); throws on a bad one. */
export function parseRules(list: readonly string[]): Rule[] {
  return list.map((e) => {
    const r = parseRule(e)
    if (typeof r === 'string') throw new Error(r)
    return r
  })
}

const portIn = (r: PortRange | null, port: number): boolean => r === null || (port >= r.from && port <= r.to)

const nameMatches = (r: Rule & { kind: 'name' }, name: string): boolean => (r.subdomains ? name.endsWith(`.${r.name}`) : name === r.name)

function matchName(rules: readonly Rule[], name: string | null, port: number): Rule | null {
  if (name === null) return null
  for (const r of rules) if (r.kind === 'name' && portIn(r.ports, port) && nameMatches(r, name)) return r
  return null
}

function matchAddress(rules: readonly Rule[], ip: Ip, port: number): Rule | null {
  for (const r of rules) if (r.kind === 'cidr' && portIn(r.ports, port) && inCidr(r.net, ip)) return r
  return null
}

// ---- the decision --------------------------------------------------------------------------

const deny = (reason: DenyReason, match: string, ip?: Ip): Verdict => ({
  allowed: false,
  reason,
  always: reason === 'metadata' || reason === 'link_local' || reason === 'own_listener',
  match,
  ...(ip ? { address: formatIp(ip) } : {}),
})

/** This host's own address (loopback, unspecified, or one of its interfaces). */
function isOwnAddress(ip: Ip, local: LocalView): string | null {
  const r = firstRange(LOCAL, ip)
  if (r) return r
  for (const a of local.ownAddresses) if (sameIp(a, ip)) return `${formatIp(a)} (this host)`
  return null
}

/**
 * What can be decided from the name alone, before (and instead of) resolving it: a metadata
 * name, `localhost` on one of Paygate's own ports, a name in `egress.deny`. Null: the
 * addresses decide (see `decide`).
 */
export function decideName(name: string, port: number, rules: EgressRules, local: LocalView): Verdict | null {
  if (METADATA_NAMES.has(name)) return deny('metadata', name)
  if (local.ownPorts.has(port) && isLocalhostName(name)) return deny('own_listener', `${name}:${port}`)
  const d = matchName(rules.deny, name, port)
  if (d) return deny('deny_list', d.text)
  return null
}

/**
 * Whether a connection to `target` may be made: every address it resolved to must pass (a
 * name with one forbidden address is refused as a whole). Checks run in CHECK_ORDER, each
 * over the name and all addresses; `egress.allow` comes after `deny_list` and before the
 * default-denied ranges.
 */
export function decide(target: Target, rules: EgressRules, local: LocalView): Verdict {
  const { name, port, addresses } = target
  if (name !== null && METADATA_NAMES.has(name)) return deny('metadata', name)
  for (const ip of addresses) {
    const r = firstRange(METADATA_ADDRESSES, ip)
    if (r) return deny('metadata', r, ip)
  }
  for (const ip of addresses) {
    const r = firstRange(LINK_LOCAL, ip)
    if (r) return deny('link_local', r, ip)
  }
  if (local.ownPorts.has(port)) {
    if (name !== null && isLocalhostName(name)) return deny('own_listener', `${name}:${port}`)
    for (const ip of addresses) {
      const own = isOwnAddress(ip, local)
      if (own) return deny('own_listener', own, ip)
    }
  }
  const byName = matchName(rules.deny, name, port)
  if (byName) return deny('deny_list', byName.text)
  for (const ip of addresses) {
    const d = matchAddress(rules.deny, ip, port)
    if (d) return deny('deny_list', d.text, ip)
  }
  if (target.operator) return { allowed: true, by: 'operator' }
  if (matchName(rules.allow, name, port)) return { allowed: true, by: 'allow_list' }
  const unlisted = addresses.filter((ip) => !matchAddress(rules.allow, ip, port))
  for (const [reason, list] of DEFAULT_DENIED) {
    for (const ip of unlisted) {
      const r = firstRange(list, ip)
      if (r) return deny(reason, r, ip)
    }
  }
  return { allowed: true, by: unlisted.length < addresses.length ? 'allow_list' : 'default' }
}

/** The canonical form of a host as the guard matches it: lower case, no brackets, no trailing dot. */
export function canonicalName(host: string): string {
  let h = host.trim().toLowerCase()
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1)
  return h.endsWith('.') ? h.slice(0, -1) : h
}
