import { createHmac } from 'node:crypto'

/** `sha256=<hex HMAC-SHA256 of the raw body>` keyed with the account's webhook secret (spec: Authentication 5). */
export const signature = (secret: string, body: string): string => `sha256=${createHmac('sha256', secret).update(body, 'utf8').digest('hex')}`

/** The headers of every attempt of one delivery: same body bytes, same signature, same id. */
export const webhookHeaders = (secret: string, body: string, deliveryId: string, event: string): Record<string, string> => ({
  'x-service-signature': signature(secret, body),
  'x-paygate-delivery': deliveryId,
  'x-paygate-event': event,
})
