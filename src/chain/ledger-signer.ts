import type { Hex } from 'viem'
import { keccak256Bytes } from '../crypto/keccak.js'
import type { FastSigner } from '../crypto/secp256k1.js'
import { signEip1559 } from './eip1559.js'
import { encodeRecordCall } from './ledger-call.js'
import type { LedgerEntry } from './ledger-tx.js'

const GAS_LIMIT = 300_000n

/** What a ledger record's signature depends on besides the entry and the nonce. */
export interface LedgerSignContext {
  chainId: number
  ledger: string
  maxFeePerGas: bigint
  maxPriorityFeePerGas: bigint
}

export interface SignedLedgerTx {
  raw: Hex
  hash: Hex
}

/** Signs PaymentLedger.record() transactions with one key: pure, so the signing thread runs the same code. */
export class LedgerSigner {
  /** The ledger address as bytes, converted once. */
  private to: { address: string; bytes: Buffer } | undefined

  constructor(private readonly key: FastSigner) {}

  sign(ctx: LedgerSignContext, e: LedgerEntry, nonce: bigint): SignedLedgerTx {
    if (this.to?.address !== ctx.ledger) this.to = { address: ctx.ledger, bytes: addressBytes(ctx.ledger) }
    const { chainId, maxFeePerGas, maxPriorityFeePerGas } = ctx
    const fields = { chainId, nonce, gas: GAS_LIMIT, maxFeePerGas, maxPriorityFeePerGas, to: this.to.bytes, value: 0n, data: encodeRecordCall(e) }
    const raw = signEip1559(fields, (payload) => this.key.signDigestBytes(keccak256Bytes(payload)))
    return { raw: `0x${raw.toString('hex')}`, hash: `0x${keccak256Bytes(raw).toString('hex')}` }
  }
}

function addressBytes(a: string): Buffer {
  if (!/^0x[0-9a-fA-F]{40}$/.test(a)) throw new RangeError(`not an address: ${a}`)
  return Buffer.from(a.slice(2), 'hex')
}
