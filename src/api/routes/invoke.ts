import { createHash } from 'node:crypto'
import { validateAgentId } from '../../agents/registry.js'
import { canonicalJson, type Idempotency } from '../../engine/idempotency.js'
import { PaygateError, invalid } from '../../errors/index.js'
import type { InvocationRunner, InvokeInput } from '../../invoke/runner.js'
import { costOf } from '../../invoke/runner.js'
import type { InvocationBook } from '../../policy/invocations.js'
import { AmountError, MAX_USDC_UNITS, parseDecimal } from '../../util/money.js'
import { onlyFields } from '../http.js'
import { requireAgentAccess, type Route } from '../router.js'

export const RUN_ID_RE = /^[A-Za-z0-9._-]{1,64}$/

function parseBudget(v: unknown): bigint {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw invalid('budget', 'budget must be {usdc: <decimal amount>}')
  // Unknown fields are refused as at the top level: a currency other than usdc must not pass as a cap it is not.
  for (const k of Object.keys(v)) if (k !== 'usdc') throw invalid(`budget.${k}`, `unknown field budget.${k}`)
  const usdcValue = (v as Record<string, unknown>).usdc
  if (typeof usdcValue !== 'number' && typeof usdcValue !== 'string') throw invalid('budget.usdc', 'budget.usdc (a decimal amount) is required')
  let units: bigint
  try {
    units = parseDecimal(usdcValue)
  } catch (e) {
    throw invalid('budget.usdc', `budget.usdc ${e instanceof AmountError ? e.message : 'is not an amount'}`)
  }
  if (units > MAX_USDC_UNITS) throw invalid('budget.usdc', 'budget.usdc is out of range')
  return units
}

/** The invoke request: X-Agent-Id names the orchestrator; X-Paygate-Invocation nests it in an open invocation. */
function parseInvoke(raw: unknown, headers: Record<string, string | string[] | undefined>): InvokeInput {
  const b = onlyFields(raw, ['agentEndpoint', 'task', 'budget', 'runId', 'idempotencyKey'])
  const agentHeader = headers['x-agent-id']
  if (typeof agentHeader !== 'string' || agentHeader === '') throw invalid('X-Agent-Id', 'the X-Agent-Id header (the orchestrating agent) is required')
  let agentId: string
  try {
    agentId = validateAgentId(agentHeader)
  } catch {
    throw invalid('X-Agent-Id', 'X-Agent-Id must match [A-Za-z0-9._-]{1,64}')
  }
  if (typeof b.agentEndpoint !== 'string') throw invalid('agentEndpoint', 'agentEndpoint (an http or https URL) is required')
  let url: URL
  try {
    url = new URL(b.agentEndpoint)
  } catch {
    throw invalid('agentEndpoint', 'agentEndpoint must be an absolute http or https URL')
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw invalid('agentEndpoint', 'agentEndpoint must be an http or https URL')
  if (b.task === undefined) throw invalid('task', 'task (any JSON value) is required')
  const cap = parseBudget(b.budget)
  if (b.runId !== undefined && (typeof b.runId !== 'string' || !RUN_ID_RE.test(b.runId))) throw invalid('runId', 'runId must match [A-Za-z0-9._-]{1,64}')
  if (b.idempotencyKey !== undefined && (typeof b.idempotencyKey !== 'string' || b.idempotencyKey.length < 1 || b.idempotencyKey.length > 255)) {
    throw invalid('idempotencyKey', 'idempotencyKey must be a string of 1 to 255 characters')
  }
  const token = headers['x-paygate-invocation']
  return {
    ...{ agentId, agentEndpoint: url.toString(), task: b.task, cap },
    ...(b.runId !== undefined ? { runId: b.runId as string } : {}),
    ...(b.idempotencyKey !== undefined ? { idempotencyKey: b.idempotencyKey as string } : {}),
    ...(typeof token === 'string' ? { parentToken: token } : {}),
  }
}

/** The same logical invoke: endpoint, task, cap, run and enclosing invocation. */
const invokeDigest = (p: InvokeInput): string =>
  createHash('sha256')
    .update(canonicalJson({ agentEndpoint: p.agentEndpoint, task: p.task, cap: p.cap.toString(), runId: p.runId ?? null, parent: p.parentToken ?? null }))
    .digest('hex')

/** `POST /v1/agents/invoke` (matched before `/v1/agents/:agentId`: `invoke` is a reserved agent id). */
export function invokeRoutes(runner: InvocationRunner, book: InvocationBook, idem: Idempotency): Route[] {
  return [
    {
      method: 'POST',
      path: '/v1/agents/invoke',
      access: 'agent',
      maxJsonDepth: 512,
      async handler(ctx) {
        const p = parseInvoke(await ctx.body(), ctx.headers)
        requireAgentAccess(ctx.identity, p.agentId)
        if (!p.idempotencyKey) return { status: 200, body: await runner.invoke(p) }
        const key = p.idempotencyKey
        // Cut off by a restart: the invocation it opened was closed as interrupted; that is its answer.
        const recover = async (): Promise<undefined> => {
          const rec = await book.byIdempotencyKey(p.agentId, key)
          if (!rec) return undefined
          throw new PaygateError('sub_agent_failed', 'the invocation was interrupted by a restart of Paygate', {
            extra: { upstreamStatus: null, ...costOf(rec), invocationId: rec.id, txHash: rec.rootTxHash },
          })
        }
        const body = await idem.run(p.agentId, `invoke\x00${key}`, invokeDigest(p), () => runner.invoke(p), undefined, recover)
        return { status: 200, body }
      },
    },
  ]
}
