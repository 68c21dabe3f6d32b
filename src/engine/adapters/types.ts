import type { ErrorCode } from '../../errors/index.js'
import type { StoredAuthorization, TxRecord } from '../../ledger/transactions.js'
import type { Address, Hex, HttpAnswer, PayableChain, ProtocolName, Settlement } from '../../protocols/types.js'
import type { UpstreamResponse } from '../../upstream/upstream.js'

/** What the engine passes to an adapter about the request being paid for. */
export interface PayRequest {
  agentId: string
  url: string
  /** `new URL(url).origin`, when the caller has it already (the proxy: one URL parse less per request). */
  origin?: string
  method: string
  /** Lower-case names; hop-by-hop and Paygate's own headers already removed. */
  headers: Record<string, string>
  body: Buffer | null
  parentTxHash?: string
  /** The caller's idempotency key, kept on the transaction so a replay after a crash finds it. */
  idempotencyKey?: string
  /** An open invocation's token (`X-Paygate-Invocation`): the payment joins its tree under its cap. */
  invocation?: string
  /** Wait this long for the target's answer headers on every send (default: the upstream layer's, `pay.timeoutMs`). */
  timeoutMs?: number
}

/** The agent's wallet as an adapter may use it: its address and a digest signer. */
export interface SigningWallet {
  address: Address
  signDigest(digest: Hex): Hex
}

export interface AuthorizeInput {
  req: PayRequest
  /** The transaction id: rails use it as their idempotency key. */
  txId: string
  wallet: SigningWallet
  nowMs: number
}

/**
 * One attempt at delivering a payment. `served`: the target took it and answered (the
 * answer goes back to the agent); `refused`: the target said no (a 402, or a 4xx from a
 * payment endpoint); `transient`: a timeout, reset or 5xx (the same authorization may be
 * resent after the chain says it was not used).
 */
export type Delivery =
  | { kind: 'served'; response: UpstreamResponse }
  | { kind: 'refused'; response: UpstreamResponse | null; error: string; code?: ErrorCode }
  | { kind: 'transient'; response: UpstreamResponse | null; error: string }

/**
 * One way to pay, chosen from a 402 by an adapter: plain data plus the three steps the
 * engine drives. The engine owns policy, reservation, retries and records; a plan only
 * signs, sends and reads the answer.
 */
export interface Plan {
  protocol: ProtocolName
  /** `stablecoin` for on-chain payments, else the MPP rail (`card`, ...). */
  rail: string
  /** MPP: the method identifier as offered. */
  paymentMethod?: string
  /** USDC base units: what policy, budget and the ledger see. */
  amount: bigint
  /** What the transaction record keeps about the offer. */
  offer: NonNullable<TxRecord['offer']>
  /** Paid from the agent's wallet, so the on-chain balance check applies. */
  fromWallet: boolean
  /** Signs locally and fast (under the agent's lock and stored with the reservation, or with `prepare`); else a remote rail is asked after reserving. */
  signsLocally: boolean
  /** EIP-3009 plans whose nonce the offer fixes (MPP evm/charge: from the challenge): payable once, ever. */
  fixedNonce?: Hex
  /**
   * The payment is made before the served answer (mpp/1.0: the payment endpoint's 2xx), so that
   * answer's status says nothing about it; else an answer of 400 or more is checked on chain.
   */
  paidWhenServed?: boolean
  /** MPP: the service sells a session for later calls (one negotiation per agent and service). */
  sellsSession?: boolean
  authorize(input: AuthorizeInput): Promise<StoredAuthorization>
  /**
   * EIP-3009 plans: the authorization's fields before its signature. The reservation needs
   * only `from`, `nonce` and `validBefore` to be settled after a crash (the chain says whether
   * the nonce was used), so the engine writes it with the unsigned fields (`signature: ''`)
   * and signs while that write is in flight; the signature is stored with the outcome.
   */
  prepare?(input: AuthorizeInput): { unsigned: StoredAuthorization; sign(): StoredAuthorization }
  deliver(req: PayRequest, auth: StoredAuthorization, txId: string): Promise<Delivery>
  settlement(headers: UpstreamResponse['headers']): Settlement | null
}

/**
 * What one protocol made of a 402: not present; present and payable (a plan); present
 * but not payable here (`why`); or present and malformed (`malformed`: the body claims
 * the protocol but does not parse, or names an unsupported currency).
 */
export type Detected = { present: false } | { present: true; plan: Plan } | { present: true; plan: null; why: string; malformed: boolean; expired?: boolean }

export interface ProtocolAdapter {
  readonly protocol: ProtocolName
  detect(answer: HttpAnswer, req: PayRequest, chain: PayableChain): Detected
}
