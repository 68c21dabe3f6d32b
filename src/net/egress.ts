import { channels } from '../events/channels.js'
import { lookup as dnsLookup, type LookupAddress } from 'node:dns'
import type { LookupFunction } from 'node:net'
import { networkInterfaces } from 'node:os'
import { PaygateError } from '../errors/index.js'
import type { Logger } from '../log/index.js'
import { canonicalName, decide, decideName, formatIp, parseIp, parseRules, type DenyReason, type EgressRules, type Ip, type LocalView, type Verdict } from './egress-decide.js'

/**
 * The one egress guard: every connection Paygate opens for an agent (the engine's undici
 * pool, the proxy's own keep-alive pool, CONNECT pass-through tunnels, WebSocket upgrades)
 * asks it first. A name is resolved once, every address it resolved to is checked, and the
 * connection goes to those checked addresses only (no second lookup a rebinding DNS
 * answer could switch). The decision itself is pure (egress-decide.ts).
 */

export interface ResolvedAddress {
  address: string
  family: 4 | 6
}

/** All addresses of a name (dns.lookup with `all`), injectable for tests. */
export type Resolver = (host: string) => Promise<ResolvedAddress[]>

export const systemResolver: Resolver = (host) =>
  new Promise((resolve, reject) => {
    dnsLookup(host, { all: true }, (err, addresses: LookupAddress[]) => (err ? reject(err) : resolve(addresses.map((a) => ({ address: a.address, family: a.family === 6 ? 6 : 4 })))))
  })

export interface CheckOptions {
  /** An operator-configured target (notification URLs, a sub-agent endpoint set by the operator): only the always-denied list and `egress.deny` apply. */
  operator?: boolean
}

export interface EgressGuardOptions {
  allow: readonly string[]
  deny: readonly string[]
  log: Logger
  resolver?: Resolver
  /** This host's interface addresses (default: os.networkInterfaces(), re-read at most once a minute). */
  interfaces?: () => string[]
}

const INTERFACES_TTL_MS = 60_000

function hostAddresses(): string[] {
  const out: string[] = []
  for (const list of Object.values(networkInterfaces())) for (const i of list ?? []) out.push(i.address)
  return out
}

/** A refusal: 403 `egress_denied` wherever it surfaces (POST /v1/pay, the proxy). */
export const isEgressDenied = (e: unknown): e is PaygateError => e instanceof PaygateError && e.code === 'egress_denied'

/** Why, after "it is" or "it resolves to an address". */
const WHY: Record<DenyReason, (match: string) => string> = {
  metadata: () => 'a cloud metadata service (always denied)',
  link_local: (m) => `in ${m} (link-local), where cloud metadata services live (always denied)`,
  // Most often a shell with the agent's proxy variables set calling the API itself.
  own_listener: () => "one of Paygate's own listeners (always denied; call its API directly, not through its proxy: unset HTTPS_PROXY and HTTP_PROXY, or list the API's host in NO_PROXY)",
  deny_list: (m) => `in egress.deny (${m})`,
  private: (m) => `in ${m}, a private range denied by default (an operator can open it with egress.allow)`,
  reserved: (m) => `in ${m}, not a unicast range, denied by default (an operator can open it with egress.allow)`,
}

const authority = (host: string, port: number): string => `${host.includes(':') ? `[${host}]` : host}:${port}`

export class EgressGuard {
  /** Denials so far, in all and by reason (the metrics export reads these). */
  readonly counters: { denied: number; byReason: Record<DenyReason, number> } = {
    denied: 0,
    byReason: { metadata: 0, link_local: 0, own_listener: 0, deny_list: 0, private: 0, reserved: 0 },
  }
  private readonly rules: EgressRules
  private readonly ownPorts = new Set<number>()
  private ownAddresses: Ip[] = []
  private interfacesReadAt = -Infinity
  private readonly resolver: Resolver
  private readonly log: Logger
  private readonly interfaces: () => string[]

  constructor(opts: EgressGuardOptions) {
    this.rules = { allow: parseRules(opts.allow), deny: parseRules(opts.deny) }
    this.resolver = opts.resolver ?? systemResolver
    this.log = opts.log
    this.interfaces = opts.interfaces ?? hostAddresses
  }

  /** Paygate's own listeners (the bound ports): refused on every local address, whatever the configuration. */
  protect(...ports: number[]): void {
    for (const p of ports) if (p > 0) this.ownPorts.add(p)
  }

  get protectedPorts(): number[] {
    return [...this.ownPorts]
  }

  /** The interfaces matter only for Paygate's own ports: read when one is asked for, at most once a minute. */
  private localFor(port: number): LocalView {
    if (this.ownPorts.has(port) && performance.now() - this.interfacesReadAt > INTERFACES_TTL_MS) {
      this.interfacesReadAt = performance.now()
      this.ownAddresses = this.interfaces().flatMap((a) => parseIp(a) ?? [])
    }
    return { ownPorts: this.ownPorts, ownAddresses: this.ownAddresses }
  }

  private refuse(host: string, port: number, v: Verdict & { allowed: false }, operator: boolean): PaygateError {
    this.counters.denied++
    this.counters.byReason[v.reason]++
    if (channels.egressDenied.hasSubscribers) channels.egressDenied.publish({ reason: v.reason })
    this.log.warn({ host, port, reason: v.reason, match: v.match, ...(v.address ? { address: v.address } : {}), ...(operator ? { operator } : {}) }, 'egress denied')
    // A resolved address is named by its range only: the agent learns no internal DNS answer.
    const named = v.address !== undefined && v.reason !== 'own_listener' && v.reason !== 'metadata' && !parseIp(canonicalName(host))
    const why = `${named ? 'it resolves to an address' : 'it is'} ${WHY[v.reason](v.match)}`
    return new PaygateError('egress_denied', `connections to ${authority(host, port)} are not allowed: ${why}`, { extra: { reason: v.reason } })
  }

  /**
   * What can be decided without resolving: an IP literal in any spelling is decided fully
   * (returned as its canonical address), a name only by name (metadata names, `egress.deny`
   * names, `localhost` on an own port). Throws `egress_denied`; null: the name must be resolved.
   */
  checkNow(host: string, port: number, opts: CheckOptions = {}): ResolvedAddress | null {
    const name = canonicalName(host)
    const ip = parseIp(name)
    const local = this.localFor(port)
    if (ip) {
      const v = decide({ name: null, port, addresses: [ip], operator: opts.operator === true }, this.rules, local)
      if (!v.allowed) throw this.refuse(host, port, v, opts.operator === true)
      return { address: formatIp(ip), family: ip.v }
    }
    const v = decideName(name, port, this.rules, local)
    if (v && !v.allowed) throw this.refuse(host, port, v, opts.operator === true)
    return null
  }

  /**
   * Resolve `host` once and check every address: the addresses a connection may use, in the
   * resolver's order. Throws `egress_denied`, or the resolver's error.
   */
  async check(host: string, port: number, opts: CheckOptions = {}): Promise<ResolvedAddress[]> {
    const literal = this.checkNow(host, port, opts)
    if (literal) return [literal]
    const name = canonicalName(host)
    const found = await this.resolver(name)
    if (!found.length) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${name}`), { code: 'ENOTFOUND', hostname: name })
    const addresses: Ip[] = []
    for (const a of found) {
      const ip = parseIp(a.address)
      if (!ip) throw new Error(`the resolver answered ${JSON.stringify(a.address)} for ${name}, not an address`)
      addresses.push(ip)
    }
    const v = decide({ name, port, addresses, operator: opts.operator === true }, this.rules, this.localFor(port))
    if (!v.allowed) throw this.refuse(host, port, v, opts.operator === true)
    return found
  }

  /**
   * Options for net.connect / tls.connect (or an http.request) to `host:port`: an IP literal
   * is checked now (throws `egress_denied`) and connected to as its canonical address; a name
   * gets a `lookup` that resolves it once through `check`, so the socket connects only to
   * addresses that passed (a refusal is the socket's error). Spread them over the options;
   * keep `servername` as the name for TLS.
   */
  connectOptions(host: string, port: number, opts: CheckOptions = {}): { host: string; lookup: LookupFunction } {
    const literal = this.checkNow(host, port, opts)
    if (literal) return { host: literal.address, lookup: answer(() => Promise.resolve([literal]), host) }
    return { host, lookup: answer(() => this.check(host, port, opts), host) }
  }
}

/** A net `lookup` that answers with the addresses `checked` passed (net asks once per connection). */
function answer(checked: () => Promise<ResolvedAddress[]>, host: string): LookupFunction {
  return (_hostname, options, callback) => {
    checked().then(
      (found) => {
        const family = options.family === 4 || options.family === 6 ? options.family : 0
        const usable = family ? found.filter((a) => a.family === family) : found
        if (!usable.length) return callback(Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' }), '', 0)
        if (options.all) (callback as unknown as (e: null, a: ResolvedAddress[]) => void)(null, usable)
        else callback(null, usable[0]!.address, usable[0]!.family)
      },
      (e: NodeJS.ErrnoException) => callback(e, '', 0),
    )
  }
}
