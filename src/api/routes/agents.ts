import { AGENT_ID_RE, type KeyRecord, type Registry } from '../../agents/registry.js'
import { invalid } from '../../errors/index.js'
import { intParam, onlyFields } from '../http.js'
import type { Route } from '../router.js'

export const keyView = (k: KeyRecord): Record<string, unknown> => ({
  keyId: k.keyId,
  kind: k.kind,
  ...(k.agentId ? { agentId: k.agentId } : {}),
  prefix: k.prefix,
  createdAt: k.createdAt,
  ...(k.revokedAt ? { revokedAt: k.revokedAt } : {}),
})

/** Agents and API keys: account-level operations. New keys are shown once, in the 201. */
export const agentRoutes = (registry: Registry): Route[] => [...agentResourceRoutes(registry), ...agentKeyRoutes(registry), ...accountKeyRoutes(registry)]

/** Create, list, read and delete agents. */
function agentResourceRoutes(registry: Registry): Route[] {
  return [
    {
      method: 'POST',
      path: '/v1/agents',
      access: 'account',
      async handler(ctx) {
        const body = onlyFields(await ctx.body(), ['agentId'])
        const { agent, key } = await registry.createAgent(body.agentId === undefined ? undefined : (body.agentId as string))
        return { status: 201, body: { agentId: agent.agentId, apiKey: key.apiKey, keyId: key.keyId, createdAt: agent.createdAt } }
      },
    },
    {
      method: 'GET',
      path: '/v1/agents',
      access: 'account',
      async handler(ctx) {
        const limit = intParam(ctx.url, 'limit', 100, 1, 1000)
        const cursor = ctx.url.searchParams.get('cursor') ?? undefined
        if (cursor !== undefined && !AGENT_ID_RE.test(cursor)) throw invalid('cursor', 'cursor must be a nextCursor value from a previous page')
        return { status: 200, body: await registry.listAgents({ limit, ...(cursor ? { cursor } : {}) }) }
      },
    },
    {
      method: 'GET',
      path: '/v1/agents/:agentId',
      access: 'account',
      async handler(ctx) {
        const agent = await registry.requireAgent(ctx.params.agentId!)
        return { status: 200, body: agent }
      },
    },
    {
      method: 'DELETE',
      path: '/v1/agents/:agentId',
      access: 'account',
      async handler(ctx) {
        await registry.deleteAgent(ctx.params.agentId!)
        return { status: 204 }
      },
    },
  ]
}

/** An agent's own keys. */
function agentKeyRoutes(registry: Registry): Route[] {
  return [
    {
      method: 'POST',
      path: '/v1/agents/:agentId/keys',
      access: 'account',
      async handler(ctx) {
        onlyFields(await ctx.body(), [])
        const agentId = ctx.params.agentId!
        const key = await registry.issueAgentKey(agentId)
        return { status: 201, body: { agentId, ...key } }
      },
    },
    {
      method: 'GET',
      path: '/v1/agents/:agentId/keys',
      access: 'account',
      async handler(ctx) {
        const keys = await registry.listAgentKeys(ctx.params.agentId!)
        return { status: 200, body: { keys: keys.map(keyView) } }
      },
    },
  ]
}

/** Account keys; DELETE revokes any key, account or agent. */
function accountKeyRoutes(registry: Registry): Route[] {
  return [
    {
      method: 'POST',
      path: '/v1/keys',
      access: 'account',
      async handler(ctx) {
        onlyFields(await ctx.body(), [])
        const key = await registry.issueAccountKey()
        return { status: 201, body: { kind: 'account', ...key } }
      },
    },
    {
      method: 'GET',
      path: '/v1/keys',
      access: 'account',
      async handler() {
        return { status: 200, body: { keys: (await registry.listAccountKeys()).map(keyView) } }
      },
    },
    {
      method: 'DELETE',
      path: '/v1/keys/:keyId',
      access: 'account',
      async handler(ctx) {
        return { status: 200, body: keyView(await registry.revokeKey(ctx.params.keyId!)) }
      },
    },
  ]
}
