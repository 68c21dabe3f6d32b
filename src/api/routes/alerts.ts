import { PaygateError, invalid, notFound } from '../../errors/index.js'
import type { Notifications } from '../../notify/index.js'
import { maskChannel, refuseMasked, sentUrl } from '../../notify/mask.js'
import { agentIdOf, alertInput, type Alert } from '../../notify/model.js'
import { onlyFields } from '../http.js'
import { requireAgentAccess, type Route } from '../router.js'

/** An alert as the API shows it (channel URLs masked). */
export const alertView = (a: Alert): Record<string, unknown> => ({
  alertId: a.alertId,
  agentId: a.agentId,
  type: a.type,
  ...(a.threshold !== undefined ? { threshold: a.threshold } : {}),
  ...(a.window !== undefined ? { window: a.window } : {}),
  notify: maskChannel(a.notify),
  createdAt: a.createdAt,
})

/** PATCH: the stored alert's fields with the body's over them (null removes one). */
function merged(a: Alert, body: Record<string, unknown>): Record<string, unknown> {
  if (body.agentId !== undefined && body.agentId !== a.agentId) throw invalid('agentId', "an alert's agentId cannot change")
  const out: Record<string, unknown> = { agentId: a.agentId, type: a.type, threshold: a.threshold, window: a.window, notify: a.notify, ...body }
  // The channel as a GET showed it (masked) sent back unchanged keeps the stored one; any other change must send the full URL.
  if (JSON.stringify(body.notify) === JSON.stringify(maskChannel(a.notify))) out.notify = a.notify
  else if (body.notify !== undefined) refuseMasked('notify.url', sentUrl(body.notify))
  for (const k of Object.keys(out)) if (out[k] === null || out[k] === undefined) delete out[k]
  return out
}

/** Alerts: account key to write; an agent key reads its own agent's. */
export function alertRoutes(n: Notifications): Route[] {
  return [
    {
      method: 'POST',
      path: '/v1/alerts',
      access: 'account',
      async handler(ctx) {
        const body = onlyFields(await ctx.body(), ['agentId', 'type', 'threshold', 'window', 'notify'])
        refuseMasked('notify.url', sentUrl(body.notify))
        return { status: 201, body: alertView(await n.book.create(alertInput(body, n.smtpConfigured))) }
      },
    },
    {
      method: 'GET',
      path: '/v1/alerts',
      access: 'agent',
      async handler(ctx) {
        let agentId = ctx.url.searchParams.get('agentId') || undefined
        if (agentId !== undefined) agentIdOf(agentId)
        if (ctx.identity?.kind === 'agent') {
          if (agentId && agentId !== ctx.identity.agentId) throw new PaygateError('forbidden', "an agent key may only list its own agent's alerts")
          agentId = ctx.identity.agentId
        }
        const alerts = agentId ? n.book.ofAgent(agentId) : n.book.all()
        // As the transactions listing: an agent that does not exist is 404, not an empty list.
        if (!alerts.length && agentId && !(await n.agentExists(agentId))) throw notFound(`agent ${agentId}`)
        return { status: 200, body: { alerts: alerts.map(alertView) } }
      },
    },
    {
      method: 'GET',
      path: '/v1/alerts/:alertId',
      access: 'agent',
      async handler(ctx) {
        const a = n.book.get(ctx.params.alertId!)
        requireAgentAccess(ctx.identity, a.agentId)
        return { status: 200, body: alertView(a) }
      },
    },
    {
      method: 'PATCH',
      path: '/v1/alerts/:alertId',
      access: 'account',
      async handler(ctx) {
        const body = onlyFields(await ctx.body(), ['agentId', 'type', 'threshold', 'window', 'notify'])
        const a = n.book.get(ctx.params.alertId!)
        return { status: 200, body: alertView(await n.book.update(a.alertId, alertInput(merged(a, body), n.smtpConfigured))) }
      },
    },
    {
      method: 'DELETE',
      path: '/v1/alerts/:alertId',
      access: 'account',
      async handler(ctx) {
        await n.book.remove(ctx.params.alertId!)
        return { status: 204 }
      },
    },
    {
      method: 'POST',
      path: '/v1/alerts/:alertId/test',
      access: 'account',
      async handler(ctx) {
        const d = await n.notifier.test(n.book.get(ctx.params.alertId!))
        return { status: 202, body: { deliveryId: d.id, event: d.event, status: d.status } }
      },
    },
  ]
}
