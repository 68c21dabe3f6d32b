import type { BatchOp } from '../store/index.js'
import { accountBucketPuts, agentBucketPut } from './bucket-ops.js'
import { bucketKey, type Level } from './bucket-store.js'
import type { Bucket } from './buckets.js'
import type { Delta } from './deltas.js'
import type { Rows } from './replica-rows.js'

interface AccountMarks {
  precision: Level
  start: number
  endpoints: Set<string>
  agents: Set<string>
}

/**
 * The buckets counted into since the last checkpoint (`checkpoints.ts`), by identity: a
 * payment marks four of them, and their keys and values are made once per checkpoint, not
 * once per payment. For an account bucket, which of its entries (each stored under a key of
 * its own) changed too.
 */
export class DirtyBuckets {
  private agents = new Map<Bucket, string>()
  private account = new Map<Bucket, AccountMarks>()

  agent(b: Bucket, agentId: string, precision: Level, start: number): void {
    if (!this.agents.has(b)) this.agents.set(b, bucketKey(agentId, precision, start))
  }

  accountBucket(b: Bucket, precision: Level, start: number, d: Delta, endpoint: string): void {
    let m = this.account.get(b)
    if (!m) this.account.set(b, (m = { precision, start, endpoints: new Set(), agents: new Set() }))
    if (d.kind !== 'paid') return
    m.endpoints.add(endpoint)
    m.agents.add(d.agentId)
  }

  /** A bucket dropped (past retention): not written again. */
  forget(b: Bucket): void {
    this.agents.delete(b)
    this.account.delete(b)
  }

  /** The puts that store every marked bucket as it is now; the marks are cleared. */
  take(rows: Rows): BatchOp[] {
    const ops: BatchOp[] = []
    for (const [b, key] of this.agents) ops.push(agentBucketPut(rows, key, b, false))
    for (const [b, m] of this.account) ops.push(...accountBucketPuts(rows, m.precision, m.start, b, m.endpoints, m.agents, false))
    this.agents = new Map()
    this.account = new Map()
    return ops
  }
}
