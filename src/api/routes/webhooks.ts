import type { Notifications } from '../../notify/index.js'
import { maskUrl, refuseMasked } from '../../notify/mask.js'
import { eventsOf, httpUrl, type WebhookEndpoint } from '../../notify/model.js'
import { onlyFields } from '../http.js'
import type { Route } from '../router.js'

export const webhookView = (w: WebhookEndpoint): Record<string, unknown> => ({ webhookId: w.webhookId, url: maskUrl(w.url), events: w.events, createdAt: w.createdAt })

/** The account's webhook endpoints and its signing secret: account key only. */
export function webhookRoutes(n: Notifications): Route[] {
  return [
    {
      method: 'POST',
      path: '/v1/webhooks',
      access: 'account',
      async handler(ctx) {
        const body = onlyFields(await ctx.body(), ['url', 'events'])
        refuseMasked('url', body.url)
        return { status: 201, body: webhookView(await n.book.addEndpoint(httpUrl('url', body.url), eventsOf(body.events))) }
      },
    },
    {
      method: 'GET',
      path: '/v1/webhooks',
      access: 'account',
      async handler() {
        return { status: 200, body: { webhooks: n.book.listEndpoints().map(webhookView) } }
      },
    },
    {
      method: 'GET',
      path: '/v1/webhooks/:webhookId',
      access: 'account',
      async handler(ctx) {
        return { status: 200, body: webhookView(n.book.endpoint(ctx.params.webhookId!)) }
      },
    },
    {
      method: 'DELETE',
      path: '/v1/webhooks/:webhookId',
      access: 'account',
      async handler(ctx) {
        await n.book.removeEndpoint(ctx.params.webhookId!)
        return { status: 204 }
      },
    },
    {
      method: 'GET',
      path: '/v1/settings/webhooks',
      access: 'account',
      async handler() {
        return { status: 200, body: { secret: await n.secret.get() } }
      },
    },
    {
      method: 'POST',
      path: '/v1/settings/webhooks/rotate',
      access: 'account',
      async handler(ctx) {
        onlyFields(await ctx.body(), [])
        return { status: 200, body: { secret: await n.secret.rotate() } }
      },
    },
  ]
}
