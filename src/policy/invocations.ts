import { createHash } from 'node:crypto'
import { PaygateError } from '../errors/index.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import { randomBase62, randomHex } from '../util/random.js'
import { closeNested, fitsCap, holdUnder, settleUnder, type CapState } from './caps.js'

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
  /** At close: base units of payments still unknown (held until they settle). */
  pending?: string
  upstreamStatus?: number
}

/** A record change as the record hook passes it (the fields read here; policy sits below the ledger). */
type SettledChange = { kind: string; record: { id: string; status: string; txHash: string | null; invocation?: { id: string } } } | { kind: 'session' }

/** What a payment made with an invocation's token needs to know of it. */
export interface InvocationContext {
  id: string
  orchestrator: string
  invokers: string[]
  rootTxId: string
  capHold: boolean
}

/** Holds under a cap are keyed by payment transaction id (`tx_…`) or nested invocation id (`inv_…`). */
const isPaymentHold = (key: string): boolean => key.startsWith('tx_')

export const newInvocationId = (now: number): string => `inv_${now.toString(36).padStart(9, '0')}${randomBase62(10)}`
/** An opaque, unguessable token for one invocation. */
export const newInvocationToken = (): string => `pgi_${randomHex(32)}`
export const tokenHash = (token: string): string => createHash('sha256').update(token).digest('hex')

/**
 * Invocations and their caps. Open invocations live in memory (this process is the only writer
 * of its data directory, as for usage in PolicyStore) and every change is a store operation
 * written with the record it belongs to: a cap decision and the update it makes are one
 * synchronous step, so concurrent payments of different agents under one cap can never both
 * take its last room. Closed ones are read from the store.
 */
export class InvocationBook {
  readonly records: Collection<InvocationRecord>
  private readonly byToken: Collection<string>
  private readonly byRun: Collection<string>
  private readonly runs: Collection<{ createdAt: number }>
  private readonly byKey: Collection<string>
  private readonly open = new Map<string, InvocationRecord>()
  private readonly tokens = new Map<string, string>()
  /** Payment transaction id -> the open invocation whose cap holds it. */
  private readonly owners = new Map<string, string>()

  constructor(store: Store) {
    this.records = store.collection('invocations')
    this.byToken = store.collection('invByToken')
    this.byRun = store.collection('invByRun')
    this.runs = store.collection('runs')
    this.byKey = store.collection('invByKey')
  }

  /** The store operation for `rec`'s newest state (taken when its batch is written). */
  private put(rec: InvocationRecord): BatchOp {
    return { type: 'put', coll: this.records, key: rec.id, value: rec, latest: () => this.open.get(rec.id) ?? rec }
  }

  openRecord(id: string): InvocationRecord | undefined {
    return this.open.get(id)
  }

  /** Open invocation `id` and the open ones nested under it, at any depth. */
  openTree(id: string): InvocationRecord[] {
    const root = this.open.get(id)
    if (!root) return []
    const out = [root]
    for (let i = 0; i < out.length; i++) for (const r of this.open.values()) if (r.parentId === out[i]!.id) out.push(r)
    return out
  }

  async get(id: string): Promise<InvocationRecord | undefined> {
    return this.open.get(id) ?? (await this.records.get(id))
  }

  /** The open invocation of `token`, or 402 `budget_exceeded` (closed or unknown). */
  async resolve(token: string): Promise<InvocationRecord> {
    const hash = tokenHash(token)
    const id = this.tokens.get(hash)
    const rec = id ? this.open.get(id) : undefined
    if (rec) return rec
    const known = await this.byToken.get(hash)
    throw new PaygateError('budget_exceeded', known ? `invocation closed: its token no longer pays (invocation ${known})` : 'the X-Paygate-Invocation token is not one of an open invocation')
  }

  context(rec: InvocationRecord): InvocationContext {
    return { id: rec.id, orchestrator: rec.agentId, invokers: rec.invokers, rootTxId: rec.rootTxId, capHold: rec.capHold }
  }

  /** Does a payment of `amount` fit under invocation `id`'s cap now? */
  fits(id: string, amount: bigint): { ok: true } | { ok: false; detail: string } {
    const rec = this.open.get(id)
    if (!rec) return { ok: false, detail: 'invocation closed: its token no longer pays' }
    return fitsCap(rec, amount)
  }

  /** Hold a payment under the cap (checked again: this is the step that takes the room). Null when it no longer fits. */
  holdPayment(id: string, txId: string, amount: bigint): BatchOp[] | null {
    const rec = this.open.get(id)
    if (!rec || !fitsCap(rec, amount).ok) return null
    const next = holdUnder(rec, txId, amount)
    this.open.set(id, next)
    this.owners.set(txId, id)
    return [this.put(next)]
  }

  /** Carve a nested invocation's cap out of its parent's room: null when it does not fit. */
  carve(parentId: string, childId: string, cap: bigint): { ok: true; ops: BatchOp[] } | { ok: false; detail: string } {
    const parent = this.open.get(parentId)
    if (!parent) return { ok: false, detail: 'invocation closed: its token no longer pays' }
    const fit = fitsCap(parent, cap)
    if (!fit.ok) return { ok: false, detail: fit.detail.replace('payment of', 'a nested invocation budget of') }
    const next = holdUnder(parent, childId, cap)
    this.open.set(parentId, next)
    return { ok: true, ops: [this.put(next)] }
  }

  /** Give a carved cap back (the nested invocation could not be opened). */
  uncarve(parentId: string, childId: string): void {
    const parent = this.open.get(parentId)
    if (parent) this.open.set(parentId, settleUnder(parent, childId, false))
  }

  /** Operations that store a new open invocation with its indexes; it is open in memory from now. */
  opened(rec: InvocationRecord): BatchOp[] {
    this.open.set(rec.id, rec)
    this.tokens.set(rec.tokenHash, rec.id)
    const ops: BatchOp[] = [this.put(rec), { type: 'put', coll: this.byToken, key: rec.tokenHash, value: rec.id }]
    if (rec.runId) {
      ops.push({ type: 'put', coll: this.byRun, key: `${rec.agentId}\x00${rec.runId}\x00${rec.id}`, value: '' })
      ops.push({ type: 'put', coll: this.runs, key: `${rec.agentId}\x00${rec.runId}`, value: { createdAt: rec.createdAt } })
    }
    if (rec.idempotencyKey) ops.push({ type: 'put', coll: this.byKey, key: `${rec.agentId}\x00${rec.idempotencyKey}`, value: rec.id })
    return ops
  }

  /** Forget an invocation whose opening write failed. */
  dropOpened(rec: InvocationRecord): void {
    this.open.delete(rec.id)
    this.tokens.delete(rec.tokenHash)
  }

  /**
   * Close invocation `id` (and any nested one still open under it: their tokens die with it).
   * A nested invocation hands its spend and its unknown payments to its parent. Returns the
   * closed records, `id`'s first, and the operations that store them.
   */
  close(id: string, status: Exclude<InvocationStatus, 'open'>, now: number, extra: Partial<InvocationRecord> = {}): { closed: InvocationRecord[]; ops: BatchOp[] } {
    const closed: InvocationRecord[] = []
    const ops: BatchOp[] = []
    const one = (rid: string, more: Partial<InvocationRecord>): void => {
      // Children first, so what they spent reaches this one before it closes.
      for (const child of [...this.open.values()].filter((r) => r.parentId === rid)) one(child.id, {})
      const rec = this.open.get(rid)
      if (!rec) return
      // Payments still open under it (nested caps are keyed by invocation id, and closed by now).
      const payments = Object.entries(rec.holds).filter(([k]) => isPaymentHold(k))
      const pending = payments.reduce((a, [, v]) => a + BigInt(v), 0n)
      const done: InvocationRecord = { ...rec, ...more, status, closedAt: now, pending: pending.toString() }
      this.open.delete(rid)
      this.tokens.delete(rec.tokenHash)
      const parent = rec.parentId ? this.open.get(rec.parentId) : undefined
      if (parent) {
        const next = closeNested(parent, rid, { ...rec, holds: Object.fromEntries(payments) })
        for (const [k, owner] of this.owners) if (owner === rid) this.owners.set(k, parent.id)
        this.open.set(parent.id, next)
        ops.push(this.put(next))
      } else {
        for (const [k, owner] of this.owners) if (owner === rid) this.owners.delete(k)
      }
      ops.push({ type: 'put', coll: this.records, key: rid, value: done })
      closed.unshift(done)
    }
    one(id, extra)
    // `id`'s own record first.
    closed.sort((a, b) => (a.id === id ? -1 : b.id === id ? 1 : 0))
    return { closed, ops }
  }

  /**
   * The record hook's contributor: a payment under a cap that settles moves its hold to spent
   * (paid) or drops it (failed); a held one (`unknown`) stays. A paid one joins the payment
   * chain of its invocation and of every open one around it.
   */
  readonly contributor = (change: SettledChange): BatchOp[] => {
    if ((change.kind !== 'paid' && change.kind !== 'finished') || !('record' in change)) return []
    const r = change.record
    const owner = this.owners.get(r.id)
    if (!owner || r.status === 'unknown' || r.status === 'pending') return []
    const paid = change.kind === 'paid'
    this.owners.delete(r.id)
    const ops: BatchOp[] = []
    const rec = this.open.get(owner)
    if (rec) {
      this.open.set(owner, settleUnder(rec, r.id, paid))
      ops.push(this.put(rec))
    }
    if (paid && r.txHash && r.invocation) {
      for (let at = this.open.get(r.invocation.id); at; at = at.parentId ? this.open.get(at.parentId) : undefined) {
        const withHash = { ...at, chain: [...at.chain, r.txHash] }
        this.open.set(at.id, withHash)
        ops.push(this.put(withHash))
      }
    }
    return ops
  }

  /** The invocation opened under `idempotencyKey` by `agentId`, if any. */
  async byIdempotencyKey(agentId: string, key: string): Promise<InvocationRecord | undefined> {
    const id = await this.byKey.get(`${agentId}\x00${key}`)
    return id ? this.get(id) : undefined
  }

  /** Invocations of a run, oldest first. */
  async ofRun(agentId: string, runId: string): Promise<InvocationRecord[]> {
    const prefix = `${agentId}\x00${runId}\x00`
    const ids: string[] = []
    for await (const k of this.byRun.keys({ gte: prefix, lt: `${agentId}\x00${runId}\x01` })) ids.push(k.slice(prefix.length))
    const recs = await Promise.all(ids.map((id) => this.get(id)))
    return recs.filter((r): r is InvocationRecord => !!r)
  }

  /** An agent's runs in runId order; `cursor` is the last runId of the previous page. */
  async listRuns(agentId: string, limit: number, cursor?: string): Promise<{ runs: { runId: string; createdAt: number }[]; nextCursor: string | null }> {
    const prefix = `${agentId}\x00`
    const out: { runId: string; createdAt: number }[] = []
    const gt = cursor !== undefined ? prefix + cursor : undefined
    for await (const [k, v] of this.runs.entries({ ...(gt ? { gt } : { gte: prefix }), lt: `${agentId}\x01`, limit: limit + 1 })) out.push({ runId: k.slice(prefix.length), createdAt: v.createdAt })
    const more = out.length > limit
    if (more) out.pop()
    return { runs: out, nextCursor: more ? out[out.length - 1]!.runId : null }
  }

  /** Take an invocation a previous run left open back into memory, to close it (at start). */
  adopt(rec: InvocationRecord): void {
    this.open.set(rec.id, rec)
  }

  /** Invocations a previous run of the process left open (read at start, before anything opens). */
  async leftOpen(): Promise<InvocationRecord[]> {
    const out: InvocationRecord[] = []
    for await (const [, r] of this.records.entries()) if (r.status === 'open') out.push(r)
    return out
  }
}
