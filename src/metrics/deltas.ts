import type { RecordChange } from '../ledger/record-hooks.js'
import type { TxRecord } from '../ledger/transactions.js'
import { addByAgent, addPaid, addRejected, type Bucket } from './buckets.js'

/**
 * What a record change adds to the aggregates, as plain data (pure). A payment counts at its
 * record's `createdAt` (the API's `timestamp`); its latency is from creation to paid.
 */
export type Delta =
  | { kind: 'paid'; agentId: string; at: number; amount: bigint; protocol: 'x402' | 'mpp' | null; latencyMs: number; endpoint: string }
  | { kind: 'rejected'; agentId: string; at: number; reason: string }
  | { kind: 'session'; agentId: string; at: number }
  | { kind: 'delegated'; agentId: string; at: number; amount: bigint }

const NONE: Delta[] = []

/** The deltas of a record in its current state: how a backfill or a recount sees it. */
export function deltasOfRecord(r: TxRecord): Delta[] {
  if (r.status === 'rejected') return [{ kind: 'rejected', agentId: r.agentId, at: r.createdAt, reason: r.reason ?? 'unknown' }]
  // An invocation's root record is a run total, not a payment from a wallet.
  if (r.status !== 'paid' || r.kind === 'invocation') return NONE
  const amount = BigInt(r.amount)
  const out: Delta[] = [{ kind: 'paid', agentId: r.agentId, at: r.createdAt, amount, protocol: r.protocol, latencyMs: Math.max(0, r.updatedAt - r.createdAt), endpoint: r.endpoint }]
  for (const invoker of new Set(r.invocation?.invokers ?? [])) {
    if (invoker !== r.agentId) out.push({ kind: 'delegated', agentId: invoker, at: r.createdAt, amount })
  }
  return out
}

/** The deltas of a change as the engine writes it: each payment once, when it turns paid. */
export function deltasOf(change: RecordChange): Delta[] {
  switch (change.kind) {
    case 'rejected':
      return deltasOfRecord(change.record)
    case 'paid':
      return change.prev.status === 'paid' ? NONE : deltasOfRecord(change.record)
    case 'session':
      return [{ kind: 'session', agentId: change.agentId, at: change.at }]
    default:
      return NONE
  }
}

/** A delta as stored (a change counted in memory, not yet in the stored buckets): amounts as decimal strings. */
export type StoredDelta =
  | { k: 'paid'; a: string; t: number; v: string; p: 'x402' | 'mpp' | null; l: number; e: string }
  | { k: 'rejected'; a: string; t: number; r: string }
  | { k: 'session'; a: string; t: number }
  | { k: 'delegated'; a: string; t: number; v: string }

export function storedDelta(d: Delta): StoredDelta {
  switch (d.kind) {
    case 'paid':
      return { k: 'paid', a: d.agentId, t: d.at, v: d.amount.toString(), p: d.protocol, l: d.latencyMs, e: d.endpoint }
    case 'rejected':
      return { k: 'rejected', a: d.agentId, t: d.at, r: d.reason }
    case 'session':
      return { k: 'session', a: d.agentId, t: d.at }
    default:
      return { k: 'delegated', a: d.agentId, t: d.at, v: d.amount.toString() }
  }
}

export function deltaFromStore(s: StoredDelta): Delta {
  switch (s.k) {
    case 'paid':
      return { kind: 'paid', agentId: s.a, at: s.t, amount: BigInt(s.v), protocol: s.p, latencyMs: s.l, endpoint: s.e }
    case 'rejected':
      return { kind: 'rejected', agentId: s.a, at: s.t, reason: s.r }
    case 'session':
      return { kind: 'session', agentId: s.a, at: s.t }
    default:
      return { kind: 'delegated', agentId: s.a, at: s.t, amount: BigInt(s.v) }
  }
}

/** Add `d` to a bucket, its payment under `endpoint` (as the hour decided: `endpointKey`). */
export function applyDelta(b: Bucket, d: Delta, endpoint: string): void {
  if (d.kind === 'paid') addPaid(b, { amount: d.amount, protocol: d.protocol, latencyMs: d.latencyMs, endpoint })
  else if (d.kind === 'rejected') addRejected(b, d.reason)
  else if (d.kind === 'session') b.sessions++
  else b.delegated += d.amount
}

/** The account's bucket counts the delta as the agent's does, and the payment in `by_agent`. */
export function applyAccount(b: Bucket, d: Delta, endpoint: string): void {
  applyDelta(b, d, endpoint)
  if (d.kind === 'paid') addByAgent(b, d.agentId, d.amount)
}
