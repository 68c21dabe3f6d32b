import { PaygateError, invalid, notFound } from '../../errors/index.js'
import { networkShown } from '../../chain/chain.js'
import { TX_STATUSES, txView, type Transactions, type TxListFilter, type TxRecord, type TxStatus } from '../../ledger/transactions.js'
import { intParam } from '../http.js'
import { chainView, nodeOf, treeView } from '../../ledger/trees.js'
import type { Identity } from '../../agents/registry.js'
import { requireAgentAccess, type Route } from '../router.js'

/** An agent key reads a chain or tree only if its agent is in it. */
function requireInTree(identity: Identity | null, agents: Set<string>): void {
  if (identity?.kind === 'agent' && !agents.has(identity.agentId)) throw new PaygateError('forbidden', 'an agent key may only read trees its own agent is in')
}

/** `GET /v1/transactions/<tx>/chain` or `/tree`, from any node. */
function treeRoute(transactions: Transactions, what: 'chain' | 'tree', view: typeof chainView): Route {
  return {
    method: 'GET',
    path: `/v1/transactions/:id/${what}`,
    access: 'agent',
    async handler(ctx) {
      const { agents, body } = await view(transactions, await nodeOf(transactions, ctx.params.id!))
      requireInTree(ctx.identity, agents)
      return { status: 200, body }
    },
  }
}

const PROTOCOLS = ['x402', 'mpp'] as const

/** An ISO 8601 timestamp query parameter, in ms. */
function timeParam(url: URL, name: string): number | undefined {
  const v = url.searchParams.get(name)
  if (v === null || v === '') return undefined
  const ms = /^\d{4}-\d{2}-\d{2}/.test(v) ? Date.parse(v) : Number.NaN
  if (!Number.isFinite(ms) || ms < 0) throw invalid(name, `${name} must be an ISO 8601 timestamp, e.g. 2026-11-21T10:00:00Z`)
  return ms
}

/** The listing's query: agentId, status, protocol, from/to, limit, cursor. */
function listFilter(url: URL): TxListFilter {
  const q = url.searchParams
  const agentId = q.get('agentId') || undefined
  const status = q.get('status') || undefined
  if (status !== undefined && !TX_STATUSES.includes(status as TxStatus)) throw invalid('status', `status must be one of ${TX_STATUSES.join(', ')}`)
  const protocol = q.get('protocol') || undefined
  if (protocol !== undefined && !PROTOCOLS.includes(protocol as 'x402')) throw invalid('protocol', `protocol must be one of ${PROTOCOLS.join(', ')}`)
  const from = timeParam(url, 'from')
  const to = timeParam(url, 'to')
  if (from !== undefined && to !== undefined && from >= to) throw invalid('to', 'to must be later than from')
  const limit = intParam(url, 'limit', 50, 1, 1000)
  const cursor = q.get('cursor') || undefined
  if (cursor !== undefined && !/^tx_[0-9a-z]{9}[0-9A-Za-z]{10}$/.test(cursor)) throw invalid('cursor', 'cursor must be a nextCursor value from a previous page')
  return {
    limit,
    ...(agentId ? { agentId } : {}),
    ...(status ? { status: status as TxStatus } : {}),
    ...(protocol ? { protocol: protocol as 'x402' | 'mpp' } : {}),
    ...(from !== undefined ? { from } : {}),
    ...(to !== undefined ? { to } : {}),
    ...(cursor ? { cursor } : {}),
  }
}

/**
 * Transactions, newest first; agent keys see only their own agent. `agentExists`: a filter
 * naming an agent with no transactions answers 404 when no such agent exists (a deleted
 * agent's history stays listed).
 */
export function transactionRoutes(transactions: Transactions, chain: { chainId: number; network: string }, agentExists: (agentId: string) => Promise<boolean>): Route[] {
  const view = (r: TxRecord) => txView(r, (n) => networkShown(n, chain))
  return [
    {
      method: 'GET',
      path: '/v1/transactions',
      access: 'agent',
      async handler(ctx) {
        const filter = listFilter(ctx.url)
        if (ctx.identity?.kind === 'agent') {
          if (filter.agentId && filter.agentId !== ctx.identity.agentId) throw new PaygateError('forbidden', "an agent key may only list its own agent's transactions")
          filter.agentId = ctx.identity.agentId
        }
        const page = await transactions.list(filter)
        if (!page.records.length && filter.agentId && !filter.cursor && !(await agentExists(filter.agentId))) throw notFound(`agent ${filter.agentId}`)
        return { status: 200, body: { transactions: page.records.map(view), nextCursor: page.nextCursor } }
      },
    },
    {
      method: 'GET',
      path: '/v1/transactions/:id',
      access: 'agent',
      async handler(ctx) {
        const r = await transactions.find(ctx.params.id!)
        if (!r) throw notFound(`transaction ${ctx.params.id}`)
        requireAgentAccess(ctx.identity, r.agentId)
        return { status: 200, body: view(r) }
      },
    },
    treeRoute(transactions, 'chain', chainView),
    treeRoute(transactions, 'tree', treeView),
  ]
}
