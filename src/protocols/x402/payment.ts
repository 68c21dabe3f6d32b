/**
 * Paying an x402 offer: the EIP-3009 authorization, its EIP-712 typed data, and the
 * request headers that carry the signed payment in the offer's own wire shape.
 */
import type { TypedDataDefinition } from 'viem'
import type { Address, Eip3009Authorization, Hex, Offer, TokenDomain } from '../types.js'
import { encodeBase64Json, fail, isObject, parseAddress, type X402Shape } from './wire.js'

/** The EIP-712 types of EIP-3009 `transferWithAuthorization`. */
export const TRANSFER_WITH_AUTHORIZATION_TYPES = {
  TransferWithAuthorization: [
    { name: 'from', type: 'address' },
    { name: 'to', type: 'address' },
    { name: 'value', type: 'uint256' },
    { name: 'validAfter', type: 'uint256' },
    { name: 'validBefore', type: 'uint256' },
    { name: 'nonce', type: 'bytes32' },
  ],
} as const

export type TransferWithAuthorizationTypedData = TypedDataDefinition<typeof TRANSFER_WITH_AUTHORIZATION_TYPES, 'TransferWithAuthorization'> & {
  domain: { name: string; version: string; chainId: number; verifyingContract: Address }
  message: Eip3009Authorization
}

const NONCE_RE = /^0x[0-9a-fA-F]{64}$/

/**
 * The EIP-3009 authorization for an offer, as the official clients build it:
 * validBefore = now + timeout (capped by `maxValiditySeconds`); validAfter = 0 for v2,
 * now - 600 otherwise (x402 v1's client). `nonce` must be 32 random bytes.
 */
export function authorizationFor(offer: Offer, p: { from: Address; nonce: Hex; nowSeconds: number; maxValiditySeconds?: number }): Eip3009Authorization {
  if (!NONCE_RE.test(p.nonce)) fail('nonce must be 32 bytes of hex')
  const from = parseAddress(p.from, 'from')
  const now = Math.floor(p.nowSeconds)
  const timeout = Math.min(offer.maxTimeoutSeconds, p.maxValiditySeconds ?? Number.MAX_SAFE_INTEGER)
  return {
    from,
    to: offer.payTo,
    value: offer.amount,
    validAfter: offer.shape === 'x402-v2' ? 0n : BigInt(Math.max(0, now - 600)),
    validBefore: BigInt(now + timeout),
    nonce: p.nonce,
  }
}

/** EIP-712 TransferWithAuthorization typed data for `auth` under a token's domain. */
export function transferTypedData(auth: Eip3009Authorization, domain: { name: string; version: string; chainId: number; verifyingContract: Address }): TransferWithAuthorizationTypedData {
  return { domain, types: TRANSFER_WITH_AUTHORIZATION_TYPES, primaryType: 'TransferWithAuthorization', message: { ...auth } }
}

/**
 * EIP-712 TransferWithAuthorization typed data for viem `signTypedData` /
 * `hashTypedData`. Domain name/version come from the offer's `extra` (what the
 * merchant's facilitator verifies against), else from `fallbackDomain`: the token's own,
 * as the token reports it (`PayableChain.tokenDomain`; the spec's simple shape names none).
 */
export function typedData(offer: Offer, auth: Eip3009Authorization, chainId: number, fallbackDomain: TokenDomain): TransferWithAuthorizationTypedData {
  return transferTypedData(auth, {
    name: offer.extra.name ?? fallbackDomain.name,
    version: offer.extra.version ?? fallbackDomain.version,
    chainId,
    verifyingContract: offer.asset,
  })
}

/** The EIP-3009 fields as JSON strings, as every wire format carries them. */
export const authorizationJson = (a: Eip3009Authorization) => ({
  from: a.from,
  to: a.to,
  value: a.value.toString(),
  validAfter: a.validAfter.toString(),
  validBefore: a.validBefore.toString(),
  nonce: a.nonce,
})

/**
 * The request headers that carry a signed payment for `offer` (lower-case names).
 * For x402 v2 the `accepted` entry is the raw entry as received: the official server
 * deep-compares it with its own requirements.
 */
export function paymentHeaders(offer: Offer, auth: Eip3009Authorization, signature: Hex): Record<string, string> {
  if (!/^0x[0-9a-fA-F]+$/.test(signature)) fail('signature must be hex')
  // The authorization must be for this very offer: facilitators reject anything else after the fact.
  if (auth.to.toLowerCase() !== offer.payTo.toLowerCase()) fail("authorization.to differs from the offer's payTo")
  if (auth.value !== offer.amount) fail("authorization.value differs from the offer's amount")
  if (!NONCE_RE.test(auth.nonce)) fail('nonce must be 32 bytes of hex')
  const authorization = authorizationJson(auth)
  switch (offer.shape as X402Shape) {
    case 'x402-v1':
      return {
        'x-payment': encodeBase64Json({
          x402Version: 1,
          scheme: offer.scheme,
          network: offer.network,
          payload: { signature, authorization },
        }),
      }
    case 'x402-v2': {
      const env = isObject(offer.envelope) ? offer.envelope : {}
      return {
        'payment-signature': encodeBase64Json({
          x402Version: 2,
          payload: { authorization, signature },
          extensions: isObject(env.extensions) ? env.extensions : undefined,
          resource: isObject(env.resource) ? env.resource : undefined,
          accepted: offer.raw,
        }),
      }
    }
    case 'spec-simple':
    case 'spec-accepts':
      // The spec's payload, plus the x402 v1 fields so that a v1-style verifier reads it too.
      return {
        'x-payment': encodeBase64Json({
          x402Version: 1,
          scheme: offer.scheme,
          network: offer.network,
          payload: {
            from: authorization.from,
            to: authorization.to,
            amount: authorization.value,
            token: offer.asset,
            nonce: authorization.nonce,
            validAfter: authorization.validAfter,
            validBefore: authorization.validBefore,
            signature,
            authorization,
          },
          signature,
        }),
        'x-payment-signature': signature,
      }
    default:
      return fail(`unknown x402 shape ${offer.shape}`)
  }
}
