import type { Hex } from 'viem'
import { keccak256Bytes } from '../crypto/keccak.js'
import type { FastSigner } from '../crypto/secp256k1.js'
import { type Eip1559Fields, rlpString, signEip1559, unsignedEip1559 } from './eip1559.js'
import { encodeRecordCall } from './ledger-call.js'
import type { LedgerEntry } from './ledger-tx.js'

const GAS_LIMIT = 300_000n

/** What a ledger record's transaction depends on besides the entry and the nonce. */
export interface LedgerSignContext {
  chainId: number
  ledger: string
  maxFeePerGas: bigint
  maxPriorityFeePerGas: bigint
  /** Made unsigned, for a node that takes them from the account impersonated (see `unsigned`). */
  unsigned?: boolean
}

/** A ledger record's transaction (signed, or unsigned for the embedded chain) and its hash. */
export interface LedgerTx {
  raw: Hex
  hash: Hex
}

/** Makes PaymentLedger.record() transactions from one key's account: pure, so the signing thread runs the same code. */
export class LedgerSigner {
  /** The ledger address as bytes, converted once. */
  private to: { address: string; bytes: Buffer } | undefined
  /** The account's address as bytes. */
  private readonly from: Buffer

  constructor(private readonly key: FastSigner) {
    this.from = addressBytes(key.address)
  }

  /** Signed, or unsigned when the context says so. */
  sign(ctx: LedgerSignContext, e: LedgerEntry, nonce: bigint): LedgerTx {
    if (ctx.unsigned) return this.unsigned(ctx, e, nonce)
    const raw = signEip1559(this.fields(ctx, e, nonce), (payload) => this.key.signDigestBytes(keccak256Bytes(payload)))
    return { raw: `0x${raw.toString('hex')}`, hash: `0x${keccak256Bytes(raw).toString('hex')}` }
  }

  /**
   * The same transaction unsigned, for a node that takes it from the account impersonated (the
   * embedded chain, see docs/devnet.md), with the hash such a node gives it: anvil hashes the
   * transaction's RLP (its typed bytes as one RLP string) followed by the sender's address.
   */
  unsigned(ctx: LedgerSignContext, e: LedgerEntry, nonce: bigint): LedgerTx {
    const raw = unsignedEip1559(this.fields(ctx, e, nonce))
    return { raw: `0x${raw.toString('hex')}`, hash: unsignedHash(raw, this.from) }
  }

  private fields(ctx: LedgerSignContext, e: LedgerEntry, nonce: bigint): Eip1559Fields {
    if (this.to?.address !== ctx.ledger) this.to = { address: ctx.ledger, bytes: addressBytes(ctx.ledger) }
    const { chainId, maxFeePerGas, maxPriorityFeePerGas } = ctx
    return { chainId, nonce, gas: GAS_LIMIT, maxFeePerGas, maxPriorityFeePerGas, to: this.to.bytes, value: 0n, data: encodeRecordCall(e) }
  }
}

/** The hash anvil gives an unsigned transaction (`raw`) it takes from `from` impersonated: keccak of its RLP, then the address. */
export function unsignedHash(raw: Uint8Array, from: Uint8Array): Hex {
  return `0x${keccak256Bytes(Buffer.concat([rlpString(raw), from])).toString('hex')}`
}

export function addressBytes(a: string): Buffer {
  if (!/^0x[0-9a-fA-F]{40}$/.test(a)) throw new RangeError(`not an address: ${a}`)
  return Buffer.from(a.slice(2), 'hex')
}
