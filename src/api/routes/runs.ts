import { validateAgentId } from '../../agents/registry.js'
import { PaygateError, invalid, notFound } from '../../errors/index.js'
import { costOf } from '../../invoke/runner.js'
import type { InvocationBook, InvocationRecord } from '../../policy/invocations.js'
import { usdc } from '../../util/money.js'
import { intParam } from '../http.js'
import type { RouteCtx, Route } from '../router.js'
import { RUN_ID_RE } from './invoke.js'

/** One invocation as a run shows it. */
export function invocationView(r: InvocationRecord): Record<string, unknown> {
  return {
    invocationId: r.id,
    txHash: r.rootTxHash,
    agentId: r.agentId,
    status: r.status,
    agentEndpoint: r.agentEndpoint,
    budget: usdc(BigInt(r.cap)),
    ...costOf(r),
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
export function runRoutes(book: InvocationBook): Route[] {
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
        const total = invs.reduce((a, r) => a + BigInt(r.spent), 0n)
        const txCount = invs.reduce((a, r) => a + r.chain.length, 0)
        return { status: 200, body: { runId, agentId, invocations: invs.map(invocationView), totalCost: usdc(total), txCount } }
      },
    },
  ]
}
