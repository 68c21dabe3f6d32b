import type { BatchOp, Collection } from '../store/index.js'
import { accountKey, accountPartKey, type Level } from './bucket-store.js'
import { encodeBucket, totalsEntry, type Bucket } from './buckets.js'
import type { Rows } from './replica-rows.js'

/**
 * The store writes of buckets. `lazy`: the value is the bucket's newest state when the batch is
 * logged (several changes in one tick write it once each, in order); else its state now.
 */
export function agentBucketPut(rows: Rows, key: string, b: Bucket, lazy: boolean): BatchOp {
  const coll = rows.agents as Collection<unknown>
  return lazy ? { type: 'put', coll, key: rows.prefix + key, value: true, latest: () => encodeBucket(b) } : { type: 'put', coll, key: rows.prefix + key, value: encodeBucket(b) }
}

/** An account bucket without its maps, and the named endpoint and by-agent entries (each its own key). */
export function accountBucketPuts(rows: Rows, precision: Level, start: number, b: Bucket, endpoints: Iterable<string>, agents: Iterable<string>, lazy: boolean): BatchOp[] {
  const { account: coll, prefix } = rows
  const put = (key: string, value: () => unknown): BatchOp => (lazy ? { type: 'put', coll, key: prefix + key, value: true, latest: value } : { type: 'put', coll, key: prefix + key, value: value() })
  const ops = [put(accountKey(precision, start), () => encodeBucket(b, false))]
  for (const name of endpoints) ops.push(put(accountPartKey(precision, start, 'e', name), () => totalsEntry(b.endpoints.get(name)!)))
  for (const name of agents) ops.push(put(accountPartKey(precision, start, 'a', name), () => totalsEntry(b.byAgent!.get(name)!)))
  return ops
}

/** The deletion of an account bucket and every entry of it. */
export function accountBucketDels(rows: Rows, precision: Level, start: number, b: Bucket): BatchOp[] {
  const del = (key: string): BatchOp => ({ type: 'del', coll: rows.account, key: rows.prefix + key })
  const out = [del(accountKey(precision, start))]
  for (const name of b.endpoints.keys()) out.push(del(accountPartKey(precision, start, 'e', name)))
  for (const name of b.byAgent?.keys() ?? []) out.push(del(accountPartKey(precision, start, 'a', name)))
  return out
}
