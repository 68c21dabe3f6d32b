import { PaygateError } from '../errors/index.js'
import type { BatchOp, Collection, Store, Txn } from '../store/index.js'
import { closeNested, fitsCap, holdUnder, settleUnder } from './caps.js'
import { isPaymentHold, settlePayments, tokenHash, treeUnder, type InvocationContext, type InvocationRecord, type InvocationStatus, type PaymentState } from './invocation-tree.js'

export { newInvocationId, newInvocationToken, tokenHash, type InvocationContext, type InvocationRecord, type InvocationStatus, type PaymentState } from './invocation-tree.js'

/** A record change as the record hook passes it (the fields read here; policy sits below the ledger). */
type SettledChange = { kind: string; record: { id: string; status: string; txHash: string | null; invocation?: { id: string } } } | { kind: 'session' }

export interface SharedBook {
  /** This replica: the owner stamped on what it opens. */
  owner: string
  /** The payment records behind holds (undefined: not found). */
  payments(ids: string[]): Promise<(PaymentState | undefined)[]>
  /** Whether a replica still holds its lease. */
  alive(replicaId: string): Promise<boolean>
}

/** The open invocations one section works on; `changed` are those it must write. */
interface Section {
  open: Map<string, InvocationRecord>
  changed: Set<string>
}

/**
 * Invocations and their caps, in one of two modes.
 *
 * - In memory (LevelDB: one process owns the data): open invocations live in memory and every
 *   change is a store operation written with the record it belongs to; a cap decision and the
 *   update it makes are one synchronous step, so concurrent payments of different agents under
 *   one cap can never both take its last room. Payments settle through the record hook.
 * - Shared (PostgreSQL, replicas): nothing is kept in memory. A section that takes room
 *   (a payment's hold, a nested carve, a close) runs inside the caller's store transaction,
 *   takes the tree's lock on it (`tx.also`, after the agent's usage lock, always in that
 *   order), reads the tree's open records fresh, and returns their new state for that
 *   transaction to write. Payments are settled lazily: each read of a tree looks up the
 *   records behind its payment holds and moves finished ones to spent (paid, with their
 *   ledger hash) or drops them, so a crash between a payment and its invocation loses nothing.
 *
 * Closed invocations are read from the store in both.
 */
export class InvocationBook {
  readonly records: Collection<InvocationRecord>
  private readonly byToken: Collection<string>
  private readonly byRun: Collection<string>
  private readonly runs: Collection<{ createdAt: number }>
  private readonly byKey: Collection<string>
  /** Open invocations: id -> owner replica ('' when unshared). */
  private readonly openIndex: Collection<string>
  /** `<outermost id>\0<id>` for every invocation of a tree. */
  private readonly trees: Collection<string>
  private readonly open = new Map<string, InvocationRecord>()
  private readonly tokens = new Map<string, string>()
  /** Payment transaction id -> the open invocation whose cap holds it (memory mode). */
  private readonly owners = new Map<string, string>()

  constructor(
    store: Store,
    private readonly shared: SharedBook | null = null,
  ) {
    this.records = store.collection('invocations')
    this.byToken = store.collection('invByToken')
    this.byRun = store.collection('invByRun')
    this.runs = store.collection('runs')
    this.byKey = store.collection('invByKey')
    this.openIndex = store.collection('invOpen')
    this.trees = store.collection('invTree')
  }

  get isShared(): boolean {
    return this.shared !== null
  }

  /** The lock of `rec`'s whole tree (a nested invocation changes its parent's record). */
  static treeKey(rec: Pick<InvocationRecord, 'id' | 'topId'>): string {
    return `inv\u0000${rec.topId ?? rec.id}`
  }

  /** The open invocations a section on `id` works on: memory's own map, or its tree read fresh (locked on `tx` when given). */
  private async section(id: string, tx: Txn | null): Promise<Section> {
    if (!this.shared) return { open: this.open, changed: new Set() }
    const rec = await this.records.get(id)
    const open = new Map<string, InvocationRecord>()
    if (!rec) return { open, changed: new Set() }
    const top = rec.topId ?? rec.id
    if (tx) await tx.also(InvocationBook.treeKey(rec))
    const ids: string[] = []
    for await (const k of this.trees.keys({ gte: `${top}\u0000`, lt: `${top}\u0001` })) ids.push(k.slice(top.length + 1))
    for (const r of await this.records.getMany(ids.length ? ids : [id])) if (r?.status === 'open') open.set(r.id, r)
    return { open, changed: await this.settleFinished(open) }
  }

  /** Shared mode: settle the tree's finished payments (see settlePayments); the ids changed. */
  private async settleFinished(open: Map<string, InvocationRecord>): Promise<Set<string>> {
    const held = [...open.values()].flatMap((r) => Object.keys(r.holds).filter(isPaymentHold))
    if (!held.length) return new Set()
    const found = await this.shared!.payments(held)
    return settlePayments(
      open,
      found.filter((p): p is PaymentState => p !== undefined),
    )
  }

  private set(s: Section, rec: InvocationRecord): void {
    s.open.set(rec.id, rec)
    s.changed.add(rec.id)
  }

  /** The writes of a section's changed open records: the newest in-memory state, or the section's. */
  private ops(s: Section): BatchOp[] {
    return [...s.changed].flatMap((id) => {
      const rec = s.open.get(id)
      return rec ? [this.put(rec)] : []
    })
  }

  private put(rec: InvocationRecord): BatchOp {
    if (this.shared) return { type: 'put', coll: this.records, key: rec.id, value: rec }
    return { type: 'put', coll: this.records, key: rec.id, value: rec, latest: () => this.open.get(rec.id) ?? rec }
  }

  /** The open invocation `id` as it stands now (shared: its finished payments settled), or undefined. */
  async live(id: string): Promise<InvocationRecord | undefined> {
    return (await this.section(id, null)).open.get(id)
  }

  /** Open invocation `id` and the open ones nested under it, at any depth (shared: locked on `tx`). */
  async openTree(id: string, tx: Txn | null = null): Promise<InvocationRecord[]> {
    return treeUnder((await this.section(id, tx)).open, id)
  }

  async get(id: string): Promise<InvocationRecord | undefined> {
    return (await this.live(id)) ?? (await this.records.get(id))
  }

  /** The open invocation of `token`, or 402 `budget_exceeded` (closed or unknown). */
  async resolve(token: string): Promise<InvocationRecord> {
    const hash = tokenHash(token)
    const id = this.shared ? await this.byToken.get(hash) : this.tokens.get(hash)
    const rec = id ? (this.shared ? await this.records.get(id) : this.open.get(id)) : undefined
    if (rec?.status === 'open') return rec
    const known = this.shared ? id : await this.byToken.get(hash)
    throw new PaygateError('budget_exceeded', known ? `invocation closed: its token no longer pays (invocation ${known})` : 'the X-Paygate-Invocation token is not one of an open invocation')
  }

  context(rec: InvocationRecord): InvocationContext {
    return { id: rec.id, orchestrator: rec.agentId, invokers: rec.invokers, rootTxId: rec.rootTxId, capHold: rec.capHold }
  }

  /** Does a payment of `amount` fit under invocation `id`'s cap now? (A first look: `holdPayment` decides.) */
  async fits(id: string, amount: bigint): Promise<{ ok: true } | { ok: false; detail: string }> {
    const rec = await this.live(id)
    if (!rec) return { ok: false, detail: 'invocation closed: its token no longer pays' }
    return fitsCap(rec, amount)
  }

  /**
   * Hold a payment under the cap, checked again (this is the step that takes the room), inside
   * the payer's locked section `tx`. The operations to write with it, or null when it no longer
   * fits (with why).
   */
  async holdPayment(tx: Txn, id: string, txId: string, amount: bigint): Promise<{ ok: true; ops: BatchOp[] } | { ok: false; detail: string }> {
    const s = await this.section(id, tx)
    const rec = s.open.get(id)
    if (!rec) return { ok: false, detail: 'invocation closed' }
    const fit = fitsCap(rec, amount)
    if (!fit.ok) return fit
    this.set(s, holdUnder(rec, txId, amount))
    if (!this.shared) this.owners.set(txId, id)
    return { ok: true, ops: this.ops(s) }
  }

  /** Carve a nested invocation's cap out of its parent's room, inside the opener's section `tx`. */
  async carve(tx: Txn, parentId: string, childId: string, cap: bigint): Promise<{ ok: true; ops: BatchOp[] } | { ok: false; detail: string }> {
    const s = await this.section(parentId, tx)
    const parent = s.open.get(parentId)
    if (!parent) return { ok: false, detail: 'invocation closed: its token no longer pays' }
    const fit = fitsCap(parent, cap)
    if (!fit.ok) return { ok: false, detail: fit.detail.replace('payment of', 'a nested invocation budget of') }
    this.set(s, holdUnder(parent, childId, cap))
    return { ok: true, ops: this.ops(s) }
  }

  /** Give a carved cap back (the nested invocation could not be opened): in memory, or (shared) written in `tx`'s section. */
  async uncarve(parentId: string, childId: string, tx: Txn | null = null): Promise<BatchOp[]> {
    const s = await this.section(parentId, tx)
    const parent = s.open.get(parentId)
    if (parent) this.set(s, settleUnder(parent, childId, false))
    return this.shared ? this.ops(s) : []
  }

  /** Whether `agentId` has a run `runId` already (its first invocation is recorded). */
  async hasRun(agentId: string, runId: string): Promise<boolean> {
    return (await this.runs.get(`${agentId}\x00${runId}`)) !== undefined
  }

  /**
   * Operations that store a new open invocation with its indexes (in memory mode it is open from
   * now). `runKnown`: its run exists already, and keeps the `createdAt` of its first invocation.
   */
  opened(opened: InvocationRecord, runKnown = false): BatchOp[] {
    const rec: InvocationRecord = this.shared ? { ...opened, owner: this.shared.owner } : opened
    if (!this.shared) {
      this.open.set(rec.id, rec)
      this.tokens.set(rec.tokenHash, rec.id)
    }
    const ops: BatchOp[] = [
      this.put(rec),
      { type: 'put', coll: this.byToken, key: rec.tokenHash, value: rec.id },
      { type: 'put', coll: this.openIndex, key: rec.id, value: rec.owner ?? '' },
      { type: 'put', coll: this.trees, key: `${rec.topId ?? rec.id}\u0000${rec.id}`, value: '' },
    ]
    if (rec.runId) {
      ops.push({ type: 'put', coll: this.byRun, key: `${rec.agentId}\x00${rec.runId}\x00${rec.id}`, value: '' })
      if (!runKnown) ops.push({ type: 'put', coll: this.runs, key: `${rec.agentId}\x00${rec.runId}`, value: { createdAt: rec.createdAt } })
    }
    if (rec.idempotencyKey) ops.push({ type: 'put', coll: this.byKey, key: `${rec.agentId}\x00${rec.idempotencyKey}`, value: rec.id })
    return ops
  }

  /** Forget an invocation whose opening write failed (memory mode). */
  dropOpened(rec: InvocationRecord): void {
    this.open.delete(rec.id)
    this.tokens.delete(rec.tokenHash)
  }

  /**
   * Close invocation `id` (and any nested one still open under it: their tokens die with it),
   * inside the orchestrator's section `tx`. A nested invocation hands its spend and its unknown
   * payments to its parent. Returns the closed records, `id`'s first, and the operations that
   * store them.
   */
  async close(tx: Txn | null, id: string, status: Exclude<InvocationStatus, 'open'>, now: number, extra: Partial<InvocationRecord> = {}): Promise<{ closed: InvocationRecord[]; ops: BatchOp[] }> {
    const s = await this.section(id, tx)
    const closed: InvocationRecord[] = []
    const ops: BatchOp[] = []
    const one = (rid: string, more: Partial<InvocationRecord>): void => {
      // Children first, so what they spent reaches this one before it closes.
      for (const child of [...s.open.values()].filter((r) => r.parentId === rid)) one(child.id, {})
      const rec = s.open.get(rid)
      if (!rec) return
      // Payments still open under it (nested caps are keyed by invocation id, and closed by now).
      const payments = Object.entries(rec.holds).filter(([k]) => isPaymentHold(k))
      const pending = payments.reduce((a, [, v]) => a + BigInt(v), 0n)
      const done: InvocationRecord = { ...rec, ...more, status, closedAt: now, pending: pending.toString() }
      s.open.delete(rid)
      s.changed.delete(rid)
      this.tokens.delete(rec.tokenHash)
      const parent = rec.parentId ? s.open.get(rec.parentId) : undefined
      if (parent) {
        this.set(s, closeNested(parent, rid, { ...rec, holds: Object.fromEntries(payments) }))
        for (const [k, owner] of this.owners) if (owner === rid) this.owners.set(k, parent.id)
      } else {
        for (const [k, owner] of this.owners) if (owner === rid) this.owners.delete(k)
      }
      ops.push({ type: 'put', coll: this.records, key: rid, value: done }, { type: 'del', coll: this.openIndex, key: rid })
      closed.unshift(done)
    }
    one(id, extra)
    ops.push(...this.ops(s))
    // `id`'s own record first.
    closed.sort((a, b) => (a.id === id ? -1 : b.id === id ? 1 : 0))
    return { closed, ops }
  }

  /**
   * The record hook's contributor (memory mode): a payment under a cap that settles moves its
   * hold to spent (paid) or drops it (failed); a held one (`unknown`) stays. A paid one joins
   * the payment chain of its invocation and of every open one around it.
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

  /** Shared mode: the open invocations whose replica is gone (its lease expired or ended), to close. */
  async orphans(): Promise<InvocationRecord[]> {
    if (!this.shared) return []
    const dead = new Map<string, boolean>()
    const ids: string[] = []
    for await (const [id, owner] of this.openIndex.entries()) {
      if (owner === this.shared.owner) continue
      if (!dead.has(owner)) dead.set(owner, !owner || !(await this.shared.alive(owner)))
      if (dead.get(owner)) ids.push(id)
    }
    const recs = await this.records.getMany(ids)
    return recs.filter((r): r is InvocationRecord => r?.status === 'open')
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
