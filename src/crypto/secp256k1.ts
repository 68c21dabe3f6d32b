import { createRequire } from 'node:module'
import type { Hex } from 'viem'
import { privateKeyToAddress } from 'viem/accounts'

/**
 * Native secp256k1 signing (the `secp256k1` package, libsecp256k1 with prebuilt binaries,
 * lives only here): ~45 us a signature against ~270 us in pure JS, with identical bytes
 * (both use RFC 6979 deterministic nonces). The package falls back to a JS
 * implementation where no prebuilt binary loads.
 */
const require = createRequire(import.meta.url)
const secp = require('secp256k1') as typeof import('secp256k1')

export interface RawSignature {
  r: Hex
  s: Hex
  yParity: 0 | 1
}

const hex = (b: Uint8Array): Hex => `0x${Buffer.from(b).toString('hex')}`

export class FastSigner {
  readonly address: Hex
  private readonly key: Uint8Array

  constructor(privateKey: Hex) {
    this.key = Buffer.from(privateKey.slice(2), 'hex')
    this.address = privateKeyToAddress(privateKey)
  }

  /** The key as hex, for a signing thread of this process only (see ledger-sign-thread.ts); never logged or stored. */
  exportKey(): Hex {
    return `0x${Buffer.from(this.key).toString('hex')}`
  }

  signDigest(digest: Hex): RawSignature {
    const { r, s, yParity } = this.signDigestBytes(Buffer.from(digest.slice(2), 'hex'))
    return { r: hex(r), s: hex(s), yParity }
  }

  /** Sign a 32-byte digest; r and s as 32 big-endian bytes each. */
  signDigestBytes(digest: Uint8Array): { r: Uint8Array; s: Uint8Array; yParity: 0 | 1 } {
    const { signature, recid } = secp.ecdsaSign(digest, this.key)
    return { r: signature.subarray(0, 32), s: signature.subarray(32, 64), yParity: recid as 0 | 1 }
  }

  /** A 65-byte `r || s || v` signature (v = 27 + yParity), as EIP-712 signers return it. */
  signDigest65(digest: Hex): Hex {
    const { signature, recid } = secp.ecdsaSign(Buffer.from(digest.slice(2), 'hex'), this.key)
    return `0x${Buffer.from(signature.buffer, signature.byteOffset, 64).toString('hex')}${(27 + recid).toString(16)}`
  }
}
