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
 */
export type TxStatus = 'pending' | 'paid' | 'rejected' | 'failed' | 'unknown'
export const TX_STATUSES: readonly TxStatus[] = ['pending', 'paid', 'rejected', 'failed', 'unknown']

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
  agentId: string
  status: TxStatus
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
  ledger?: { status: 'queued' | 'confirmed' | 'failed'; blockNumber?: number; error?: string }
  /** `invocation`: the root record of an invocation (its run total; excluded from spend metrics). */
  kind?: 'invocation'
  /** A payment made inside invocations: their id and orchestrator agentIds, outermost first. */
  invocation?: { id: string; invokers: string[] }
}

/** Sortable id: creation ms in base36 (fixed width) plus randomness. */
export const newTxId = (now: number): string => `tx_${now.toString(36).padStart(9, '0')}${randomBase62(10)}`

export function endpointOf(url: string): string {
  try {
    const u = new URL(url)
    return `${u.origin}${u.pathname}`
  } catch {
    return url
  }
}

export class Transactions {
  readonly records: Collection<TxRecord>
  private readonly byAgent: Collection<string>
  private readonly byStatus: Collection<string>
  private readonly byAgentStatus: Collection<string>
  private readonly byHash: Collection<string>
  /** `<parentTxHash>\0<id>`: the children of a node, read without a scan (cost trees). */
  private readonly byParent: Collection<string>

  constructor(private readonly store: Store) {
    this.records = store.collection('tx')
    this.byAgent = store.collection('txByAgent')
    this.byStatus = store.collection('txByStatus')
    this.byAgentStatus = store.collection('txByAgentStatus')
    this.byHash = store.collection('txByHash')
    this.byParent = store.collection('txByParent')
  }

  /** Batch ops that write `next` (replacing `prev`) with its index entries. */
  ops(next: TxRecord, prev?: TxRecord): BatchOp[] {
    const ops: BatchOp[] = [{ type: 'put', coll: this.records, key: next.id, value: next }]
    if (!prev) ops.push({ type: 'put', coll: this.byAgent, key: `${next.agentId}\x00${next.id}`, value: '' })
    if (!prev && next.parentTxHash) ops.push({ type: 'put', coll: this.byParent, key: `${next.parentTxHash.toLowerCase()}\x00${next.id}`, value: '' })
    if (prev && prev.status !== next.status) {
      ops.push({ type: 'del', coll: this.byStatus, key: `${prev.status}\x00${prev.id}` })
      ops.push({ type: 'del', coll: this.byAgentStatus, key: `${prev.agentId}\x00${prev.status}\x00${prev.id}` })
    }
    if (!prev || prev.status !== next.status) {
      ops.push({ type: 'put', coll: this.byStatus, key: `${next.status}\x00${next.id}`, value: '' })
      ops.push({ type: 'put', coll: this.byAgentStatus, key: `${next.agentId}\x00${next.status}\x00${next.id}`, value: '' })
    }
    if (next.txHash && next.txHash !== prev?.txHash) ops.push({ type: 'put', coll: this.byHash, key: next.txHash.toLowerCase(), value: next.id })
    return ops
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

  /** Newest first; `cursor` is the last id of the previous page. */
  async list(f: { agentId?: string; status?: TxStatus; limit: number; cursor?: string }): Promise<{ records: TxRecord[]; nextCursor: string | null }> {
    let coll: Collection<string>
    let prefix: string
    if (f.agentId && f.status) [coll, prefix] = [this.byAgentStatus, `${f.agentId}\x00${f.status}\x00`]
    else if (f.agentId) [coll, prefix] = [this.byAgent, `${f.agentId}\x00`]
    else if (f.status) [coll, prefix] = [this.byStatus, `${f.status}\x00`]
    else [coll, prefix] = [this.records as unknown as Collection<string>, '']
    const ids: string[] = []
    const lt = f.cursor ? prefix + f.cursor : `${prefix}\xff`
    for await (const k of coll.keys({ gte: prefix, lt, reverse: true, limit: f.limit + 1 })) ids.push(k.slice(prefix.length))
    const more = ids.length > f.limit
    if (more) ids.pop()
    const records = (await this.records.getMany(ids)).filter((r): r is TxRecord => !!r)
    return { records, nextCursor: more ? ids[ids.length - 1]! : null }
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
    const prefix = `${txHash.toLowerCase()}\x00`
    const ids: string[] = []
    for await (const k of this.byParent.keys({ gte: prefix, lt: `${txHash.toLowerCase()}\x01` })) ids.push(k.slice(prefix.length))
    return (await this.getMany(ids)).filter((r): r is TxRecord => !!r)
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

/** A transaction as the API shows it. */
export function txView(r: TxRecord): Record<string, unknown> {
  return {
    id: r.id,
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
    ...(r.reason ? { reason: r.reason } : {}),
    ...(r.detail ? { detail: r.detail } : {}),
    ...(r.error ? { error: r.error } : {}),
    ...(r.settlement ? { settlement: r.settlement } : {}),
    ...(r.offer ? { network: r.offer.network, payTo: r.offer.payTo } : {}),
    ...(r.upstreamStatus !== undefined ? { upstreamStatus: r.upstreamStatus } : {}),
    ...(r.ledger ? { ledger: r.ledger } : {}),
  }
}
