import type { Keystore } from '../wallet/keystore.js'
import { maskUrl } from './mask.js'
import type { Channel, WebhookEndpoint } from './model.js'

/** The GCM additional data: a sealed URL opens only as a notification URL. */
const CONTEXT = 'notify:url'

/**
 * Notification URLs at rest. A webhook or Slack URL often is its receiver's credential (a
 * Slack incoming-webhook URL, a `?token=`), so alerts, account endpoints and deliveries store
 * it encrypted with the wallet keys' master key (wallet/keystore.ts), beside the URL masked as
 * the API shows it (`sealed`). Alerts and endpoints are held open in memory; a delivery is
 * opened only to be sent. A row stored before URLs were sealed holds its URL as it is: it is
 * read as it is (and AlertBook seals such alerts and endpoints at start).
 */
export class UrlSeal {
  constructor(private readonly keystore: Keystore) {}

  /** The stored form of a channel. */
  seal(c: Channel): Channel {
    if (c.type === 'email' || c.sealed !== undefined) return c
    return { type: c.type, url: maskUrl(c.url, c.type === 'slack'), sealed: this.keystore.encrypt(Buffer.from(c.url, 'utf8'), CONTEXT) }
  }

  /** The channel to send to. */
  open(c: Channel): Channel {
    if (c.type === 'email' || c.sealed === undefined) return c
    return { type: c.type, url: this.keystore.decrypt(c.sealed, CONTEXT).toString('utf8') }
  }

  sealEndpoint(w: WebhookEndpoint): WebhookEndpoint {
    if (w.sealed !== undefined) return w
    return { ...w, url: maskUrl(w.url), sealed: this.keystore.encrypt(Buffer.from(w.url, 'utf8'), CONTEXT) }
  }

  openEndpoint(w: WebhookEndpoint): WebhookEndpoint {
    if (w.sealed === undefined) return w
    const { sealed, ...rest } = w
    return { ...rest, url: this.keystore.decrypt(sealed, CONTEXT).toString('utf8') }
  }
}

/** Whether a stored channel or endpoint still holds its URL in the clear. */
export const unsealed = (c: Channel | WebhookEndpoint): boolean => ('type' in c ? c.type !== 'email' && c.sealed === undefined : c.sealed === undefined)
