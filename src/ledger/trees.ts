import { PaygateError } from '../errors/index.js'
import { usdc } from '../util/money.js'
import type { Transactions, TxRecord, TxStatus } from './transactions.js'

/**
 * Cost chains and trees, read from any node through the parent index (no scan): a payment
 * hangs under its `parentTxHash`. Nodes are paid and held (`unknown`) payments; rejected and
 * failed ones moved no money and are left out. `protocol` and `endpoint` are absent on the
 * depth-0 node, as the spec shows them.
 */

/** Longest chain followed upwards, and most nodes shown in one tree (a tree cut there says `truncated`). */
export const MAX_DEPTH = 64
export const MAX_TREE_NODES = 10_000

const NODE_STATUSES: ReadonlySet<TxStatus> = new Set(['paid', 'unknown'])
/** Payments that moved money are nodes, and so are (nested) invocation roots, whatever their status. */
const isNode = (r: TxRecord): boolean => r.kind === 'invocation' || NODE_STATUSES.has(r.status)
const paidAmount = (r: TxRecord): bigint => (r.status === 'paid' && r.kind !== 'invocation' ? BigInt(r.amount) : 0n)

/** The node as a chain or tree shows it: no protocol or endpoint at depth 0 nor on an invocation root. */
function nodeView(r: TxRecord, depth: number): Record<string, unknown> {
  return {
    txHash: r.txHash,
    agentId: r.agentId,
    amountPaid: usdc(paidAmount(r)),
    ...(depth > 0 && r.kind !== 'invocation' ? { protocol: r.protocol, endpoint: r.endpoint } : {}),
    depth,
    ...(r.kind ? { kind: r.kind } : {}),
  }
}

/** `rec` and its ancestors, root first. */
export async function pathTo(transactions: Transactions, rec: TxRecord): Promise<TxRecord[]> {
  const path = [rec]
  const seen = new Set([rec.id])
  let at = rec
  while (at.parentTxHash) {
    const parent = await transactions.find(at.parentTxHash)
    if (!parent || seen.has(parent.id) || path.length > MAX_DEPTH) break
    path.unshift(parent)
    seen.add(parent.id)
    at = parent
  }
  return path
}

/** `GET /v1/transactions/<tx>/chain`: the path from the root down to `rec`. */
export async function chainView(transactions: Transactions, rec: TxRecord): Promise<{ agents: Set<string>; body: Record<string, unknown> }> {
  const path = await pathTo(transactions, rec)
  return {
    agents: new Set(path.map((r) => r.agentId)),
    body: { root: path[0]!.txHash, chain: path.map((r, i) => nodeView(r, i)) },
  }
}

interface TreeNode {
  view: Record<string, unknown>
  children: TreeNode[]
}

/** `GET /v1/transactions/<tx>/tree`: the whole tree `rec` is in, from its root. */
export async function treeView(transactions: Transactions, rec: TxRecord): Promise<{ agents: Set<string>; body: Record<string, unknown> }> {
  const [root] = await pathTo(transactions, rec)
  const agents = new Set<string>([root!.agentId])
  let total = 0n
  let count = 0
  let nodes = 1
  let truncated = false
  const top: TreeNode = { view: { ...nodeView(root!, 0), status: root!.status }, children: [] }
  total += paidAmount(root!)
  // Breadth first, a level at a time: the index reads of a level's nodes run together (only a
  // node with a txHash can have children), then their children's records are read in one getMany.
  let level: { rec: TxRecord; node: TreeNode }[] = [{ rec: root!, node: top }]
  for (let depth = 1; level.length && depth <= MAX_DEPTH; depth++) {
    const next: typeof level = []
    const ids = await Promise.all(level.map(({ rec }) => transactions.childIdsOf(rec)))
    const recs = await transactions.getMany(ids.flat())
    let at = 0
    for (const [i, { node }] of level.entries()) {
      const mine = recs.slice(at, (at += ids[i]!.length))
      for (const child of mine) {
        if (!child || !isNode(child)) continue
        if (nodes >= MAX_TREE_NODES) {
          truncated = true
          break
        }
        nodes++
        agents.add(child.agentId)
        total += paidAmount(child)
        if (child.status === 'paid' && child.kind !== 'invocation') count++
        const n: TreeNode = { view: { ...nodeView(child, depth), status: child.status }, children: [] }
        node.children.push(n)
        next.push({ rec: child, node: n })
      }
    }
    level = next
  }
  const render = (n: TreeNode): Record<string, unknown> => ({ ...n.view, children: n.children.map(render) })
  return { agents, body: { root: render(top), totalCost: usdc(total), txCount: count, ...(truncated ? { truncated: true } : {}) } }
}

/**
 * A node by ledger hash or transaction id, or 404: a rejected, failed or still pending payment
 * moved no money and has no ledger hash, so it is in no tree (else a chain with `root: null`).
 */
export async function nodeOf(transactions: Transactions, idOrHash: string): Promise<TxRecord> {
  const r = await transactions.find(idOrHash)
  if (!r) throw new PaygateError('not_found', `transaction ${idOrHash} does not exist`)
  if (!isNode(r)) throw new PaygateError('not_found', `transaction ${idOrHash} is ${r.status}: it moved no money and is in no cost tree`)
  return r
}
