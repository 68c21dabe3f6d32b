import type { UsageState } from '../policy/usage.js'
import type { BatchOp } from '../store/index.js'
import type { TxRecord } from './transactions.js'

/**
 * A change to a transaction record, as the engine writes it. `rejected`: a policy refusal,
 * recorded; `reserved`: the hold and the pending record; `paid`: settled, with its ledger
 * record; `finished`: closed unpaid (failed, released) or left open (held); without `prev`
 * when it failed before anything was reserved (insufficient funds). `paid` carries the agent's
 * usage with this payment committed (its budget period and spend, as the policy sees them);
 * `session`: a call served under an MPP session, written with the agent's usage (there is no record).
 */
export type RecordChange =
  | { kind: 'rejected'; record: TxRecord }
  | { kind: 'reserved'; record: TxRecord }
  /** `dailyBudget`: the agent's, as the payment was committed (base units; null: none), when the engine read its policy. */
  | { kind: 'paid'; record: TxRecord; prev: TxRecord; usage?: UsageState; dailyBudget?: string | null }
  | { kind: 'finished'; record: TxRecord; prev?: TxRecord }
  /** A call served under an MPP session (no payment, no record): only counters move. */
  | { kind: 'session'; agentId: string; at: number; endpoint: string }

/** Returns store operations to write in the same atomic batch as the record (aggregates, an event outbox entry). */
export type RecordContributor = (change: RecordChange) => BatchOp[]

/** Reads, before a record's change is written, what a contributor will need in memory to add to that write. */
export type RecordPreparer = (record: TxRecord) => Promise<void>

const NONE: readonly BatchOp[] = Object.freeze([])

/**
 * The record hook: contributors registered at the composition root (metrics, notifications)
 * keep their own state in step with the records by adding to each record's write, inside the
 * engine's locked section, so a crash can never leave one without the other. The engine
 * never imports them. A contributor must be synchronous, fast and must not throw.
 */
export class RecordHooks {
  private contributors: RecordContributor[] = []
  private preparers: RecordPreparer[] = []

  /** `prepare` is awaited by the engine before a change of a record it did not just create (a payment made paid). */
  addPreparer(preparer: RecordPreparer): () => void {
    this.preparers = [...this.preparers, preparer]
    return () => {
      this.preparers = this.preparers.filter((p) => p !== preparer)
    }
  }

  async prepare(record: TxRecord): Promise<void> {
    for (const p of this.preparers) await p(record)
  }

  add(contributor: RecordContributor): () => void {
    this.contributors = [...this.contributors, contributor]
    return () => {
      this.contributors = this.contributors.filter((c) => c !== contributor)
    }
  }

  /** The extra operations for `change` (none, without allocating, when nobody is registered). */
  ops(change: RecordChange): readonly BatchOp[] {
    const cs = this.contributors
    if (cs.length === 0) return NONE
    const out: BatchOp[] = []
    for (const c of cs) out.push(...c(change))
    return out
  }
}
