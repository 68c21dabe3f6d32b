import { remembered } from '../util/lru.js'
import { randomBase62 } from '../util/random.js'
import { usdc } from '../util/money.js'
import type { BatchOp, Collection, Store } from '../store/index.js'

/**
 * Local transaction records with the indexes the API lists by (agent, status, ledger tx
 * hash). Ids sort by creation time, so a reverse walk is newest first.
 *
 * Status: `pending` (reserved, payment in flight), `paid`, `rejected` (policy, nothing
 * signed), `failed` (not paid; reservation released), `unknown` (signed and sent, outcome
 * not known yet: the reservation stays held until the reconciler settles it).
 * An invocation root (`kind: 'invocation'`) is `open` while its sub-agent works, then `closed`,
 * or `interrupted` when a restart found it open; it moves no money itself.
 */
export type TxStatus = 'pending' | 'paid' | 'rejected' | 'failed' | 'unknown' | 'open' | 'closed' | 'interrupted'
export const TX_STATUSES: readonly TxStatus[] = ['pending', 'paid', 'rejected', 'failed', 'unknown', 'open', 'closed', 'interrupted']

/** Where a payment made inside an invocation belongs (metrics read it: delegated spend). */
export interface TxInvocation {
  /** The innermost open invocation the payment carried the token of. */
  id: string
  /** The orchestrators of every enclosing open invocation, outermost first. */
  invokers: string[]
}

/** A signed EIP-3009 authorization: its nonce's state on chain tells whether it was paid. */
export interface Eip3009Stored {
  kind?: 'eip3009'
  from: string
  to: string
  value: string
  validAfter: string
  validBefore: string
  nonce: string
  signature: string
}

/**
 * An authorization with no on-chain state to check (an MPP payment intent, a card token,
 * another rail's proof): `wire` is what was sent, resent unchanged on a transient failure.
 */
export interface OffChainStored {
  kind: 'intent' | 'card' | 'rail'
  /** Unix ms after which the merchant can no longer redeem it. */
  expiresAt: number
  wire: unknown
}

export type StoredAuthorization = Eip3009Stored | OffChainStored

export const isEip3009 = (a: StoredAuthorization): a is Eip3009Stored => a.kind === undefined || a.kind === 'eip3009'

export interface TxRecord {
  id: string
  /** `invocation`: the root node of a sub-agent invocation (no payment); absent on payments. */
  kind?: 'invocation'
  /** On payments made inside an invocation (with its token). */
  invocation?: TxInvocation
  agentId: string
  status: TxStatus
  /** On a store shared by replicas: the replica working on it (`CrossLocks.replicaId`); others' reconcilers wait for its lease to end. */
  owner?: string
  createdAt: number
  updatedAt: number
  /** Origin and path of the target (no query string, no credentials). */
  endpoint: string
  method: string
  protocol: 'x402' | 'mpp' | null
  /** How it was paid: `stablecoin` (x402 and MPP on chain), `card`, or another MPP rail. */
  rail?: string
  /** MPP: the payment method identifier as offered (e.g. `tempo`, `stripe`). */
  paymentMethod?: string
  /** Base units of the chosen offer. */
  amount: string
  /** Hash of the ledger transaction recording this payment (known before it is sent). */
  txHash: string | null
  parentTxHash: string | null
  depth: number
  reason?: string
  detail?: string
  error?: string
  offer?: { shape: string; scheme: string; network: string; asset: string; payTo: string; resource: string | null }
  authorization?: StoredAuthorization
  settlement?: { success: boolean; transaction: string | null; network: string | null; payer: string | null; errorReason?: string | null }
  upstreamStatus?: number
  attempts?: number
  idempotencyKey?: string
  /** `replacedTxHash`: the record's first ledger hash, when another transaction took its nonce and it was recorded again (Outbox.replace). */
  ledger?: { status: 'queued' | 'confirmed' | 'failed'; blockNumber?: number; error?: string; replacedTxHash?: string }
}

export interface TxListFilter {
  agentId?: string
  status?: TxStatus
  protocol?: TxRecord['protocol']
  /** Creation time bounds in ms: `from` inclusive, `to` exclusive. */
  from?: number
  to?: number
  limit: number
  cursor?: string
}

/** How many records one page of a protocol-filtered listing reads at most. */
export const TX_SCAN_LIMIT = 10_000

/** The smallest id created at `ms` or later (ids begin with their creation time, see newTxId). */
const idBound = (ms: number): string => `tx_${Math.max(0, ms).toString(36).padStart(9, '0')}`

/** Sortable id: creation ms in base36 (fixed width) plus randomness. */
export const newTxId = (now: number): string => `tx_${now.toString(36).padStart(9, '0')}${randomBase62(10)}`

/** The URL without its query (what a record keeps), remembered per URL. */
export const endpointOf = remembered((url: string): string => {
  try {
    const u = new URL(url)
    return `${u.origin}${u.pathname}`
  } catch {
    return url
  }
})

export class Transactions {
  readonly records: Collection<TxRecord>
  private readonly byAgent: Collection<string>
  private readonly byStatus: Collection<string>
  private readonly byAgentStatus: Collection<string>
  private readonly byHash: Collection<string>
  /** `<parentTxHash>\0<id>`: the children of a node, read without a scan (cost trees). */
  private readonly byParent: Collection<string>
  /**
   * Records that still change after they are written with their ledger hash (an invocation
   * root: closed later, while the outbox confirms its ledger record), kept here until both
   * are done, so every write of them starts from the newest state instead of a read that
   * another write may have overtaken.
   */
  private readonly live = new Map<string, TxRecord>()

  constructor(private readonly store: Store) {
    this.records = store.collection('tx')
    this.byAgent = store.collection('txByAgent')
    this.byStatus = store.collection('txByStatus')
    this.byAgentStatus = store.collection('txByAgentStatus')
    this.byHash = store.collection('txByHash')
    this.byParent = store.collection('txByParent')
  }

  /** Batch ops that write `next` (replacing `prev`; none only for a new record) with its index entries. */
  ops(next: TxRecord, prev?: TxRecord): BatchOp[] {
    if (this.live.has(next.id)) {
      const settled = next.status !== 'open' && next.ledger !== undefined && next.ledger.status !== 'queued'
      if (settled) this.live.delete(next.id)
      else this.live.set(next.id, next)
    }
    const ops: BatchOp[] = [{ type: 'put', coll: this.records, key: next.id, value: next }]
    if (!prev) ops.push({ type: 'put', coll: this.byAgent, key: `${next.agentId}\x00${next.id}`, value: '' })
    if (!prev && next.parentTxHash) ops.push({ type: 'put', coll: this.byParent, key: `${next.parentTxHash.toLowerCase()}\x00${next.id}`, value: '' })
    if (prev && prev.status !== next.status) {
      ops.push({ type: 'del', coll: this.byStatus, key: `${prev.status}\x00${prev.id}` })
      ops.push({ type: 'del', coll: this.byAgentStatus, key: `${prev.agentId}\x00${prev.status}\x00${prev.id}` })
    }
    if (!prev || prev.status !== next.status) {
      // A new record's entries are fresh: a payment's `pending` ones are deleted again within a second.
      const fresh = !prev
      ops.push({ type: 'put', coll: this.byStatus, key: `${next.status}\x00${next.id}`, value: '', fresh })
      ops.push({ type: 'put', coll: this.byAgentStatus, key: `${next.agentId}\x00${next.status}\x00${next.id}`, value: '', fresh })
    }
    if (next.txHash && next.txHash !== prev?.txHash) ops.push({ type: 'put', coll: this.byHash, key: next.txHash.toLowerCase(), value: next.id })
    return ops
  }

  /** Keep `rec` as the newest state of its record until it is closed and its ledger record confirmed (see `live`). */
  pin(rec: TxRecord): void {
    this.live.set(rec.id, rec)
  }

  /** The newest state of a pinned record (undefined when it is not pinned). */
  liveRecord(id: string): TxRecord | undefined {
    return this.live.get(id)
  }

  async put(next: TxRecord, prev?: TxRecord): Promise<void> {
    await this.store.batch(this.ops(next, prev))
  }

  async get(id: string): Promise<TxRecord | undefined> {
    return this.records.get(id)
  }

  /** Several records in one read, in the order asked (undefined where none). */
  async getMany(ids: string[]): Promise<(TxRecord | undefined)[]> {
    return ids.length ? this.records.getMany(ids) : []
  }

  /** By record id or by ledger tx hash. */
  async find(idOrHash: string): Promise<TxRecord | undefined> {
    if (idOrHash.startsWith('tx_')) return this.records.get(idOrHash)
    const id = await this.byHash.get(idOrHash.toLowerCase())
    return id ? this.records.get(id) : undefined
  }

  /**
   * Newest first; `cursor` is the last id of the previous page. `from` (inclusive) and `to`
   * (exclusive), in ms, bound the key range: ids begin with their creation time. A
   * `protocol` filter is applied while walking, at most `TX_SCAN_LIMIT` records per page: a
   * page may then hold fewer than `limit` records and still have a `nextCursor`.
   */
  async list(f: TxListFilter): Promise<{ records: TxRecord[]; nextCursor: string | null }> {
    let coll: Collection<string>
    let prefix: string
    if (f.agentId && f.status) [coll, prefix] = [this.byAgentStatus, `${f.agentId}\x00${f.status}\x00`]
    else if (f.agentId) [coll, prefix] = [this.byAgent, `${f.agentId}\x00`]
    else if (f.status) [coll, prefix] = [this.byStatus, `${f.status}\x00`]
    else [coll, prefix] = [this.records as unknown as Collection<string>, '']
    const gte = prefix + (f.from !== undefined ? idBound(f.from) : '')
    let upper = f.to !== undefined ? idBound(f.to) : '\xff'
    if (f.cursor && f.cursor < upper) upper = f.cursor
    const range = { gte, lt: prefix + upper, reverse: true }
    if (f.protocol !== undefined) return this.listWalking(coll, prefix, range, f.limit, f.protocol)
    const ids: string[] = []
    for await (const k of coll.keys({ ...range, limit: f.limit + 1 })) ids.push(k.slice(prefix.length))
    const more = ids.length > f.limit
    if (more) ids.pop()
    const records = (await this.records.getMany(ids)).filter((r): r is TxRecord => !!r)
    return { records, nextCursor: more ? ids[ids.length - 1]! : null }
  }

  /** `list` with a protocol filter: reads records in chunks, stops at `limit` matches or the scan bound. */
  private async listWalking(
    coll: Collection<string>,
    prefix: string,
    range: { gte: string; lt: string; reverse: boolean },
    limit: number,
    protocol: TxRecord['protocol'],
  ): Promise<{ records: TxRecord[]; nextCursor: string | null }> {
    const out: TxRecord[] = []
    let chunk: string[] = []
    let scanned = 0
    let lastScanned: string | null = null
    const take = async (): Promise<void> => {
      for (const r of await this.records.getMany(chunk)) if (r && r.protocol === protocol && out.length <= limit) out.push(r)
      lastScanned = chunk[chunk.length - 1] ?? lastScanned
      chunk = []
    }
    for await (const k of coll.keys(range)) {
      chunk.push(k.slice(prefix.length))
      scanned++
      if (chunk.length === 100) await take()
      if (out.length > limit || scanned >= TX_SCAN_LIMIT) break
    }
    await take()
    if (out.length > limit) {
      out.length = limit
      return { records: out, nextCursor: out[limit - 1]!.id }
    }
    return { records: out, nextCursor: scanned >= TX_SCAN_LIMIT ? lastScanned : null }
  }

  /**
   * The agent's transaction made under `idempotencyKey` since `since` (ms), newest first, or
   * undefined: how a request cut off by a crash finds what it did. Ids are time-ordered, so
   * the scan stops at the first older record.
   */
  async findByIdempotencyKey(agentId: string, key: string, since: number): Promise<TxRecord | undefined> {
    let cursor: string | undefined
    for (;;) {
      const page = await this.list({ agentId, limit: 100, ...(cursor ? { cursor } : {}) })
      for (const r of page.records) {
        if (r.createdAt < since) return undefined
        if (r.idempotencyKey === key) return r
      }
      if (!page.nextCursor) return undefined
      cursor = page.nextCursor
    }
  }

  /** The records hung under `txHash` (any status), oldest first. */
  async children(txHash: string): Promise<TxRecord[]> {
    return (await this.getMany(await this.childIds(txHash))).filter((r): r is TxRecord => !!r)
  }

  /** The ids of the records hung under `txHash`, oldest first (the index alone). */
  async childIds(txHash: string): Promise<string[]> {
    const prefix = `${txHash.toLowerCase()}\x00`
    const ids: string[] = []
    for await (const k of this.byParent.keys({ gte: prefix, lt: `${txHash.toLowerCase()}\x01` })) ids.push(k.slice(prefix.length))
    return ids
  }

  /**
   * The ids of the records hung under `rec`, oldest first: under its ledger hash, and under the
   * one it replaced (children recorded before its ledger record was recorded again, Outbox.replace).
   */
  async childIdsOf(rec: TxRecord): Promise<string[]> {
    if (!rec.txHash) return []
    const replaced = rec.ledger?.replacedTxHash
    if (!replaced) return this.childIds(rec.txHash)
    const [a, b] = await Promise.all([this.childIds(rec.txHash), this.childIds(replaced)])
    return [...b, ...a].sort()
  }

  /**
   * Build the parent index for records written before it existed (once per store: a marker in
   * `meta` says it is done). Returns how many entries it wrote.
   */
  async indexParents(meta: Collection<unknown>): Promise<number> {
    if ((await meta.get('txByParent')) === 1) return 0
    let n = 0
    let ops: BatchOp[] = []
    for await (const [id, r] of this.records.entries()) {
      if (!r.parentTxHash) continue
      ops.push({ type: 'put', coll: this.byParent, key: `${r.parentTxHash.toLowerCase()}\x00${id}`, value: '' })
      n++
      if (ops.length >= 1000) {
        await this.store.batch(ops)
        ops = []
      }
    }
    await this.store.batch([...ops, { type: 'put', coll: meta, key: 'txByParent', value: 1 }])
    return n
  }

  async *all(status: TxStatus): AsyncIterable<TxRecord> {
    for await (const k of this.byStatus.keys({ gte: `${status}\x00`, lt: `${status}\x01` })) {
      const r = await this.records.get(k.slice(status.length + 1))
      if (r) yield r
    }
  }
}

/**
 * A transaction as the API shows it. `networkOf` names the offer's network in the API's one
 * style (`networkShown`); the merchant's own `settlement.network` is shown as it sent it.
 */
export function txView(r: TxRecord, networkOf: (offered: string) => string = (n) => n): Record<string, unknown> {
  return {
    id: r.id,
    ...(r.kind ? { kind: r.kind } : {}),
    timestamp: new Date(r.createdAt).toISOString(),
    agentId: r.agentId,
    status: r.status,
    protocol: r.protocol,
    ...(r.rail ? { rail: r.rail } : {}),
    ...(r.paymentMethod ? { paymentMethod: r.paymentMethod } : {}),
    amountPaid: usdc(r.status === 'paid' ? BigInt(r.amount) : 0n),
    amountQuoted: usdc(BigInt(r.amount)),
    endpoint: r.endpoint,
    method: r.method,
    txHash: r.txHash,
    parentTxHash: r.parentTxHash,
    depth: r.depth,
    ...(r.invocation ? { invocationId: r.invocation.id } : {}),
    ...(r.reason ? { reason: r.reason } : {}),
    ...(r.detail ? { detail: r.detail } : {}),
    ...(r.error ? { error: r.error } : {}),
    ...(r.settlement ? { settlement: r.settlement } : {}),
    ...(r.offer ? { network: networkOf(r.offer.network), payTo: r.offer.payTo } : {}),
    ...(r.upstreamStatus !== undefined ? { upstreamStatus: r.upstreamStatus } : {}),
    ...(r.ledger ? { ledger: r.ledger } : {}),
  }
}
