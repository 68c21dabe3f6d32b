/**
 * Plain data shared by the protocol adapters (x402, MPP). Adapters are pure: they read
 * an HTTP answer that is already in memory and produce headers or bodies to send; no
 * sockets, no storage, no signing keys.
 */

export type ProtocolName = 'x402' | 'mpp'

export type Address = `0x${string}`
export type Hex = `0x${string}`

/** An upstream answer as the engine holds it. Header names are lower-case. */
export interface HttpAnswer {
  status: number
  headers: Record<string, string | string[] | undefined>
  body: Buffer
}

/** One way to pay that a 402 answer offers, normalised across wire shapes. */
export interface Offer {
  protocol: ProtocolName
  /** Wire shape it came from, e.g. `x402-v1`, `x402-v2`, `spec-simple`, `spec-accepts`. */
  shape: string
  scheme: string
  /** The network string exactly as offered (`base`, `eip155:8453`, `base-mainnet`, ...). */
  network: string
  /** Checksummed token address. */
  asset: Address
  /** Base units of `asset`. */
  amount: bigint
  /** Checksummed recipient. */
  payTo: Address
  /** Absolute or relative resource URL as offered, or null when the offer names none. */
  resource: string | null
  maxTimeoutSeconds: number
  /** EIP-712 domain hints for the token (x402 `extra.name`/`extra.version`). */
  extra: { name?: string; version?: string; assetTransferMethod?: string }
  /** The offer entry exactly as received (x402 v2 echoes it back byte-for-byte as `accepted`). */
  raw: unknown
  /**
   * Protocol data from outside the entry that the answer must carry back
   * (x402 v2: `{resource, extensions}` of the PAYMENT-REQUIRED object), else null.
   */
  envelope: unknown
  /** Position of the entry inside its shape's list (0 for single-offer shapes). */
  index: number
}

export interface Problem {
  shape: string
  index?: number
  message: string
}

export interface Detection {
  offers: Offer[]
  /** Entries or headers that could not be read; they never hide a good offer elsewhere. */
  problems: Problem[]
  /** True when any known shape was present, even if every offer in it was broken. */
  recognized: boolean
}

/** The `name` and `version` of a token's EIP-712 domain (chainId and verifyingContract come from the chain). */
export interface TokenDomain {
  name: string
  version: string
}

/** The chain and token Paygate pays with. */
export interface PayableChain {
  chainId: number
  /** Paygate's name for the network (e.g. `base-mainnet`, `paygate-devnet`). */
  networkName: string
  token: Address
  /**
   * The token's own EIP-712 domain, read from the token at start: EIP-3009 authorizations
   * for offers that name no domain (`extra`) are signed over it.
   */
  tokenDomain: TokenDomain
}

/** EIP-3009 TransferWithAuthorization fields. */
export interface Eip3009Authorization {
  from: Address
  to: Address
  value: bigint
  validAfter: bigint
  validBefore: bigint
  nonce: Hex
}

/** What the merchant reported about settlement (x402 `X-PAYMENT-RESPONSE` / `PAYMENT-RESPONSE`). */
export interface Settlement {
  success: boolean
  transaction: string | null
  network: string | null
  payer: string | null
  errorReason: string | null
  raw: unknown
}
