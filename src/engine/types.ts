import type { PaygateError } from '../errors/index.js'
import type { TxRecord } from '../ledger/transactions.js'
import type { StoredPolicy } from '../policy/model.js'
import type { InvocationContext } from '../policy/invocations.js'
import type { ProtocolName, Settlement } from '../protocols/types.js'
import type { PayRequest } from './adapters/types.js'
import type { MppSession } from './sessions.js'
import type { UpstreamResponse } from '../upstream/upstream.js'

export type { PayRequest } from './adapters/types.js'

export interface PaymentInfo {
  protocol: ProtocolName
  /** `stablecoin`, `card`, or another MPP rail. */
  rail: string
  amount: bigint
  txHash: string
  transactionId: string
  settlement: Settlement | null
}

/**
 * What the target answered, and the payment made for it, if any. `unpaid` explains a 402
 * Paygate could not pay (no known shape, nothing payable here): the proxy passes such an
 * answer through, `POST /v1/pay` turns it into an error. `session`: served under an MPP
 * session bought earlier, with no payment.
 */
export interface PayOutcome {
  response: UpstreamResponse
  payment: PaymentInfo | null
  unpaid?: PaygateError
  session?: { protocol: 'mpp' }
  /**
   * A payment was sent and its settlement is not proven (the target answered without reporting
   * it, or refused it): nothing is paid now, and the reservation stays held until the chain says.
   */
  held?: { transactionId: string }
}

/** What the engine looked up before the first send of one request. */
export interface PayStart {
  /** The request as sent (with `Accept-Payment` when the agent sent none). */
  req: PayRequest
  parent: TxRecord | null
  policy: StoredPolicy
  session: MppSession | null
  /** Sent with the first attempt only (the MPP session token). */
  firstHeaders: Readonly<Record<string, string>>
  /** The open invocation whose token the request carries. */
  invocation: InvocationContext | null
}

/**
 * What a first send made of the target's first answer: handed to the engine, relayed to the
 * agent already (an answer the engine has no business with: see `relayable`), or not sent at
 * all (`fallback`: the engine sends it itself).
 */
export type FirstAnswer = { kind: 'engine'; response: UpstreamResponse } | { kind: 'relayed'; status: number } | { kind: 'fallback' }

/**
 * How a caller of `PaymentEngine.pay` takes part: `firstSend` sends the first request its own
 * way (the proxy's keep-alive path, which relays a plain answer byte for byte); by default the
 * engine sends it through the upstream layer.
 */
export interface PayOptions {
  firstSend?: (start: PayStart) => Promise<FirstAnswer>
}

/** The answer went to the agent straight from the first send: nothing for the engine to do. */
export interface Relayed {
  relayed: true
  status: number
}

/** A first answer that needs nothing from the engine: no 402, no session to account for. */
export const relayable = (start: PayStart, status: number): boolean => status !== 402 && start.session === null
