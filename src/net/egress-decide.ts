/**
 * Where an agent's traffic may go: a pure decision over plain data (the target as named and
 * the addresses it resolved to, Paygate's own listeners, the operator's `egress.allow` and
 * `egress.deny`). The guard (egress.ts) resolves names and feeds this; tests drive it directly.
 *
 * Addresses are compared as numbers (ip.ts), so every spelling of one address is one address:
 * `127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1` and `::ffff:127.0.0.1` are all 127.0.0.1.
 */

import { type Cidr, cidr, formatIp, type Ip, inCidr, parseIp, parseIPv4, parseIPv6, STRICT_V4, sameIp } from './ip.js'

export { type Cidr, formatIp, type Ip, inCidr, parseIp, parseIPv4 } from './ip.js'

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
