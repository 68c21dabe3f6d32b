import { createHash } from 'node:crypto'
import { randomBase62, randomHex } from '../util/random.js'
import { settleUnder, type CapState } from './caps.js'

/* The records of invocation trees, and the pure steps on them that both modes of the book share. */

export type InvocationStatus = 'open' | 'closed' | 'interrupted'

/** One sub-agent invocation: its cap accounting (CapState) and where it sits in its tree. */
export interface InvocationRecord extends CapState {
  id: string
  /** The orchestrator. */
  agentId: string
  status: InvocationStatus
  createdAt: number
  closedAt?: number
  /** sha256 of the token: the token itself is never stored. */
  tokenHash: string
  rootTxId: string
  rootTxHash: string
  /** Depth of the root node in its tree (0, or under the parent invocation's root). */
  depth: number
  parentId: string | null
  /** Orchestrators of this invocation and every enclosing one, outermost first. */
  invokers: string[]
  agentEndpoint: string
  runId?: string
  idempotencyKey?: string
  /** The cap is held against the orchestrator's daily budget (a top-level invocation of an agent with one). */
  capHold: boolean
  /** Ledger hashes of the subtree's paid payments, in commit order (while open). */
  chain: string[]
  /** The outermost invocation of its tree (absent: written before trees were indexed; itself when top-level). */
  topId?: string
  /** The replica that opened it, on a store shared by replicas (its lease ends: another closes it). */
  owner?: string
  /** At close: base units of payments still unknown (held until they settle). */
  pending?: string
  upstreamStatus?: number
}

/** What a payment made with an invocation's token needs to know of it. */
export interface InvocationContext {
  id: string
  orchestrator: string
  invokers: string[]
  rootTxId: string
  capHold: boolean
}

/** Holds under a cap are keyed by payment transaction id (`tx_…`) or nested invocation id (`inv_…`). */
export const isPaymentHold = (key: string): boolean => key.startsWith('tx_')

/** `id`'s record and the records nested under it, at any depth, among `open`. */
export function treeUnder(open: Map<string, InvocationRecord>, id: string): InvocationRecord[] {
  const root = open.get(id)
  if (!root) return []
  const out = [root]
  for (let i = 0; i < out.length; i++) for (const r of open.values()) if (r.parentId === out[i]!.id) out.push(r)
  return out
}

export const newInvocationId = (now: number): string => `inv_${now.toString(36).padStart(9, '0')}${randomBase62(10)}`
/** An opaque, unguessable token for one invocation. */
export const newInvocationToken = (): string => `pgi_${randomHex(32)}`
export const tokenHash = (token: string): string => createHash('sha256').update(token).digest('hex')

/** A payment record as a shared book reads it to settle the holds under a cap. */
export interface PaymentState {
  id: string
  status: string
  txHash: string | null
  updatedAt: number
  invocation?: { id: string }
}

const FINAL_UNPAID = new Set(['failed', 'rejected'])

/**
 * Settle the finished payments among the holds of a tree's open records (`open`, changed in
 * place), in the order they were last updated: paid ones move to spent and join the chain of
 * the invocation they were made in and of every open one around it; failed or rejected ones
 * give their room back; the rest stay held. Returns the ids of the records changed.
 */
export function settlePayments(open: Map<string, InvocationRecord>, payments: PaymentState[]): Set<string> {
  const changed = new Set<string>()
  const holder = new Map<string, string>()
  for (const r of open.values()) for (const k of Object.keys(r.holds)) if (isPaymentHold(k)) holder.set(k, r.id)
  const done = payments.filter((p) => holder.has(p.id) && (p.status === 'paid' || FINAL_UNPAID.has(p.status)))
  done.sort((a, b) => a.updatedAt - b.updatedAt || (a.id < b.id ? -1 : 1))
  for (const p of done) {
    const at = holder.get(p.id)!
    open.set(at, settleUnder(open.get(at)!, p.id, p.status === 'paid'))
    changed.add(at)
    if (p.status !== 'paid' || !p.txHash) continue
    for (let r = open.get(p.invocation?.id ?? at) ?? open.get(at); r; r = r.parentId ? open.get(r.parentId) : undefined) {
      open.set(r.id, { ...r, chain: [...r.chain, p.txHash] })
      changed.add(r.id)
    }
  }
  return changed
}
