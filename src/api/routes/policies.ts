import type { PolicyStore } from '../../policy/store.js'
import { requireAgentAccess, type Route } from '../router.js'

/** PUT is account-level; an agent key may read its own policy (budget left, rate used). */
export function policyRoutes(policies: PolicyStore): Route[] {
  return [
    {
      method: 'GET',
      path: '/v1/policies/:agentId',
      access: 'agent',
      async handler(ctx) {
        requireAgentAccess(ctx.identity, ctx.params.agentId!)
        return { status: 200, body: await policies.view(ctx.params.agentId!) }
      },
    },
    {
      method: 'PUT',
      path: '/v1/policies/:agentId',
      access: 'account',
      async handler(ctx) {
        return { status: 200, body: await policies.update(ctx.params.agentId!, await ctx.body(), { createAgent: true }) }
      },
    },
  ]
}
