import { channel, type Channel } from 'node:diagnostics_channel'

/**
 * Instrumentation on named `node:diagnostics_channel` channels, for Prometheus counters and
 * anything else that watches: publishing costs one property read when nobody subscribes, so
 * callers guard with `hasSubscribers` and build the message only then. Names and payloads
 * are listed in docs/architecture.md.
 */
export interface ChannelMessages {
  /** A proxied request finished (paid or not). */
  'paygate:proxy:request': { agentId: string; method: string; status: number; paid: bigint | null; error: string | undefined; durationMs: number }
  /** A payment's hold and pending record were written. */
  'paygate:payment:reserved': { agentId: string; transactionId: string; protocol: string; amount: bigint }
  /** A payment settled and its record (with its ledger record) was written. */
  'paygate:payment:paid': { agentId: string; transactionId: string; protocol: string; rail: string; amount: bigint; latencyMs: number }
  /** A payment was sent and did not settle: `held` while it may still, else failed and released. */
  'paygate:payment:failed': { agentId: string; transactionId: string; protocol: string; rail: string; held: boolean; error: string }
  /** A policy refused a payment (recorded as a `rejected` transaction). */
  'paygate:payment:rejected': { agentId: string; transactionId: string; reason: string }
  /** A JSON-RPC call to the chain answered (`error` false) or failed. */
  'paygate:chain:rpc': { method: string; durationMs: number; error: boolean }
  /** A ledger record's receipt arrived: `lagMs` from the paid record to its confirmation. */
  'paygate:ledger:confirmed': { transactionId: string; success: boolean; lagMs: number }
  /** The egress guard refused a connection (`reason` as in its counters). */
  'paygate:egress:denied': { reason: string }
}

export type ChannelName = keyof ChannelMessages

const made = new Map<string, Channel>()
/** The channel of that name (diagnostics_channel keeps one per name; this keeps the typing). */
export function channelOf<K extends ChannelName>(name: K): Channel & { publish(m: ChannelMessages[K]): void } {
  let c = made.get(name)
  if (!c) made.set(name, (c = channel(name)))
  return c as Channel & { publish(m: ChannelMessages[K]): void }
}

export const channels = {
  proxyRequest: channelOf('paygate:proxy:request'),
  paymentReserved: channelOf('paygate:payment:reserved'),
  paymentPaid: channelOf('paygate:payment:paid'),
  paymentFailed: channelOf('paygate:payment:failed'),
  paymentRejected: channelOf('paygate:payment:rejected'),
  chainRpc: channelOf('paygate:chain:rpc'),
  ledgerConfirmed: channelOf('paygate:ledger:confirmed'),
  egressDenied: channelOf('paygate:egress:denied'),
}
