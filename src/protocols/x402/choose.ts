/** Choosing an x402 offer: which networks name the configured chain, which offers are payable. */
import { Lru } from '../../util/lru.js'
import type { Offer, PayableChain } from '../types.js'

/**
 * x402 v1 network names and their chain ids: the union of x402@1.2.0's
 * `EvmNetworkToChainId` and @x402/evm 2.27.0's `EVM_NETWORK_CHAIN_ID_MAP` (which the v2
 * packages use for v1 payloads). v1 servers and facilitators only know these names.
 */
export const X402_V1_NETWORKS: Readonly<Record<string, number>> = Object.freeze({
  ethereum: 1,
  sepolia: 11155111,
  abstract: 2741,
  'abstract-testnet': 11124,
  'base-sepolia': 84532,
  base: 8453,
  'avalanche-fuji': 43113,
  avalanche: 43114,
  iotex: 4689,
  sei: 1329,
  'sei-testnet': 1328,
  polygon: 137,
  'polygon-amoy': 80002,
  peaq: 3338,
  story: 1514,
  educhain: 41923,
  'skale-base-sepolia': 324705682,
  megaeth: 4326,
  monad: 143,
  stable: 988,
  'stable-testnet': 2201,
  celo: 42220,
  flare: 14,
})

/** The chain id an offer's network names, when it names one this module knows. */
export function networkChainId(network: string): number | null {
  const n = network.trim().toLowerCase()
  const m = /^eip155:(\d+)$/.exec(n)
  if (m) {
    const id = Number(m[1])
    return Number.isSafeInteger(id) ? id : null
  }
  return Object.hasOwn(X402_V1_NETWORKS, n) ? (X402_V1_NETWORKS[n] ?? null) : null
}

/** Does `network` name the configured chain? Known names must resolve to its chain id. */
export function namesChain(network: string, chain: PayableChain): boolean {
  const id = networkChainId(network)
  if (id !== null) return id === chain.chainId
  return network.trim().toLowerCase() === chain.networkName.trim().toLowerCase()
}

/**
 * Can Paygate pay this offer: EVM `exact` scheme by EIP-3009 on the configured chain in
 * the configured token. (`extra.assetTransferMethod: "permit2"` needs a Permit2 signature
 * and is not payable here.)
 */
export function isPayable(offer: Offer, chain: PayableChain): boolean {
  if (offer.protocol !== 'x402') return false
  if (offer.scheme.toLowerCase() !== 'exact') return false
  const method = offer.extra.assetTransferMethod
  if (method !== undefined && method.toLowerCase() !== 'eip3009') return false
  if (offer.asset.toLowerCase() !== chain.token.toLowerCase()) return false
  return namesChain(offer.network, chain)
}

/**
 * May this offer be paid for a request to `requestUrl`? Its resource must have the same
 * origin; an absent or relative resource counts as the request's own.
 */
export function sameOrigin(offer: Pick<Offer, 'resource'>, requestUrl: string): boolean {
  // Two URL parses: remembered per request URL and resource (a 402's offers repeat). The
  // URL's length first and a mark for no resource keep every pair's key apart.
  const key = `${requestUrl.length}:${requestUrl}${offer.resource === null ? 'n' : `s${offer.resource}`}`
  let same = seenOrigins.get(key)
  if (same === undefined) seenOrigins.set(key, (same = originsMatch(offer.resource, requestUrl)))
  return same
}
const seenOrigins = new Lru<string, boolean>(1024)

function originsMatch(resource: string | null, requestUrl: string): boolean {
  let request: URL
  try {
    request = new URL(requestUrl)
  } catch {
    return false
  }
  if (resource === null) return true
  try {
    const r = new URL(resource, request)
    if (r.origin === request.origin) return true
    // A merchant behind a TLS-terminating front reports the inner scheme: same host and
    // the same explicit port with only http/https swapped is the same server.
    const webSchemes = (u: URL) => u.protocol === 'http:' || u.protocol === 'https:'
    return webSchemes(r) && webSchemes(request) && r.port !== '' && r.port === request.port && r.hostname === request.hostname
  } catch {
    return false
  }
}

/**
 * The cheapest payable offer (ties: the first), or null. With `requestUrl`, offers for
 * another origin are left out too.
 */
export function choose(offers: readonly Offer[], chain: PayableChain, requestUrl?: string): Offer | null {
  let best: Offer | null = null
  for (const o of offers) {
    if (!isPayable(o, chain)) continue
    if (requestUrl !== undefined && !sameOrigin(o, requestUrl)) continue
    if (best === null || o.amount < best.amount) best = o
  }
  return best
}
