import { validateAgentId } from '../../agents/registry.js'
import { PaygateError, invalid, notFound } from '../../errors/index.js'
import { costFrom, subtreeOf, type Subtree } from '../../invoke/cost.js'
import type { Transactions } from '../../ledger/transactions.js'
import type { InvocationBook, InvocationRecord } from '../../policy/invocations.js'
import { usdc } from '../../util/money.js'
import { intParam } from '../http.js'
import type { RouteCtx, Route } from '../router.js'
import { RUN_ID_RE } from './invoke.js'

/** One invocation as a run shows it; `sub`: its subtree's payments as they stand now. */
export function invocationView(r: InvocationRecord, sub: Subtree): Record<string, unknown> {
  return {
    invocationId: r.id,
    txHash: r.rootTxHash,
    agentId: r.agentId,
    status: r.status,
    agentEndpoint: r.agentEndpoint,
    budget: usdc(BigInt(r.cap)),
    ...costFrom(r, sub),
    ...(r.parentId ? { parentInvocationId: r.parentId } : {}),
    createdAt: new Date(r.createdAt).toISOString(),
    ...(r.closedAt !== undefined ? { closedAt: new Date(r.closedAt).toISOString() } : {}),
  }
}

/** The `agentId` query parameter (required with the account key; an agent key's own agent by default, and only that). */
function agentOf(ctx: RouteCtx): string {
  const q = ctx.url.searchParams.get('agentId') ?? (ctx.identity?.kind === 'agent' ? ctx.identity.agentId : null)
  if (q === null) throw invalid('agentId', 'the agentId query parameter (the orchestrator) is required')
  const agentId = validateAgentId(q)
  if (ctx.identity?.kind === 'agent' && ctx.identity.agentId !== agentId) throw new PaygateError('forbidden', "an agent key may only read its own agent's runs")
  return agentId
}

/** Runs: an orchestrator's invocations grouped by its `runId` (a pipeline or a fan-out). */
export function runRoutes(book: InvocationBook, transactions: Transactions): Route[] {
  return [
    {
      method: 'GET',
      path: '/v1/runs',
      access: 'agent',
      async handler(ctx) {
        const agentId = agentOf(ctx)
        const limit = intParam(ctx.url, 'limit', 50, 1, 1000)
        const cursor = ctx.url.searchParams.get('cursor') ?? undefined
        if (cursor !== undefined && !RUN_ID_RE.test(cursor)) throw invalid('cursor', 'cursor must be a nextCursor value from a previous page')
        const page = await book.listRuns(agentId, limit, cursor)
        return { status: 200, body: { runs: page.runs.map((r) => ({ runId: r.runId, agentId, createdAt: new Date(r.createdAt).toISOString() })), nextCursor: page.nextCursor } }
      },
    },
    {
      method: 'GET',
      path: '/v1/runs/:runId',
      access: 'agent',
      async handler(ctx) {
        const agentId = agentOf(ctx)
        const runId = ctx.params.runId!
        if (!RUN_ID_RE.test(runId)) throw invalid('runId', 'runId must match [A-Za-z0-9._-]{1,64}')
        const invs = await book.ofRun(agentId, runId)
        if (!invs.length) throw notFound(`run ${runId} of agent ${agentId}`)
        // From the transactions, not the records' close-time sums: a payment in flight at a close settles later.
        const subs = await Promise.all(invs.map((r) => subtreeOf(transactions, r.rootTxId)))
        // By id: an invocation nested in another of the same run is inside its subtree too.
        const paid = new Map(subs.flatMap((s) => s.paid.map((p) => [p.id, BigInt(p.amount)] as const)))
        const total = [...paid.values()].reduce((a, v) => a + v, 0n)
        return { status: 200, body: { runId, agentId, invocations: invs.map((r, i) => invocationView(r, subs[i]!)), totalCost: usdc(total), txCount: paid.size } }
      },
    },
  ]
}
