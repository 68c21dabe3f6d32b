import { PaygateError, invalid, notFound } from '../../errors/index.js'
import type { Notifications } from '../../notify/index.js'
import { maskChannel } from '../../notify/mask.js'
import { agentIdOf, DELIVERY_STATUSES, type Delivery, type DeliveryStatus } from '../../notify/model.js'
import { intParam, onlyFields } from '../http.js'
import { requireAgentAccess, type Route } from '../router.js'

const iso = (ms: number | null): string | null => (ms === null ? null : new Date(ms).toISOString())

export const deliveryView = (d: Delivery): Record<string, unknown> => ({
  deliveryId: d.id,
  event: d.event,
  agentId: d.agentId,
  alertId: d.alertId,
  webhookId: d.webhookId,
  channel: maskChannel(d.channel),
  status: d.status,
  // Deliveries dropped before the reason was stored: their retries ran out.
  dropReason: d.status === 'dropped' ? (d.dropReason ?? 'retries_exhausted') : null,
  attempts: d.attempts.map((a) => ({ at: iso(a.at), status: a.status, error: a.error })),
  nextAttemptAt: iso(d.nextAt),
  createdAt: iso(d.createdAt),
  updatedAt: iso(d.updatedAt),
})

/** The delivery log: an agent key sees its own agent's; retrying a dropped one takes the account key. */
export function deliveryRoutes(n: Notifications): Route[] {
  return [
    {
      method: 'GET',
      path: '/v1/deliveries',
      access: 'agent',
      async handler(ctx) {
        const q = ctx.url.searchParams
        let agentId = q.get('agentId') || undefined
        if (agentId !== undefined) agentIdOf(agentId)
        if (ctx.identity?.kind === 'agent') {
          if (agentId && agentId !== ctx.identity.agentId) throw new PaygateError('forbidden', "an agent key may only list its own agent's deliveries")
          agentId = ctx.identity.agentId
        }
        const status = q.get('status') ?? undefined
        if (status !== undefined && !DELIVERY_STATUSES.includes(status as DeliveryStatus)) throw invalid('status', `status must be one of ${DELIVERY_STATUSES.join(', ')}`)
        const cursor = q.get('cursor') ?? undefined
        if (cursor !== undefined && !/^dl_[0-9a-z]{9}[0-9A-Za-z]{10}$/.test(cursor)) throw invalid('cursor', 'cursor must be a nextCursor value from a previous page')
        const alertId = q.get('alertId') ?? undefined
        const page = await n.queue.list({
          limit: intParam(ctx.url, 'limit', 50, 1, 500),
          ...(agentId ? { agentId } : {}),
          ...(alertId ? { alertId } : {}),
          ...(status ? { status: status as DeliveryStatus } : {}),
          ...(cursor ? { cursor } : {}),
        })
        // As the transactions listing: only an empty first page looks the agent up, so a deleted agent's log stays listed.
        if (!page.deliveries.length && agentId && !cursor && !(await n.agentExists(agentId))) throw notFound(`agent ${agentId}`)
        return { status: 200, body: { deliveries: page.deliveries.map(deliveryView), nextCursor: page.nextCursor } }
      },
    },
    {
      method: 'GET',
      path: '/v1/deliveries/:deliveryId',
      access: 'agent',
      async handler(ctx) {
        const d = await n.queue.get(ctx.params.deliveryId!)
        requireAgentAccess(ctx.identity, d.agentId)
        return { status: 200, body: deliveryView(d) }
      },
    },
    {
      method: 'POST',
      path: '/v1/deliveries/:deliveryId/retry',
      access: 'account',
      async handler(ctx) {
        onlyFields(await ctx.body(), [])
        return { status: 202, body: deliveryView(await n.queue.retry(ctx.params.deliveryId!)) }
      },
    },
  ]
}
