import type { Registry } from '../agents/registry.js'
import type { Logger } from '../log/index.js'
import type { EgressGuard } from '../net/egress.js'
import type { PolicyStore } from '../policy/store.js'
import type { Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import type { Keystore } from '../wallet/keystore.js'
import { AlertBook } from './alerts.js'
import { sendEmail, type SmtpSettings } from './channels/email.js'
import { postJson } from './channels/http.js'
import { webhookHeaders } from './channels/webhook.js'
import { builtInKey } from './fire.js'
import type { Delivery } from './model.js'
import { Notifier } from './notifier.js'
import { DeliveryQueue, type ReplicaLeases, type Sender } from './queue.js'
import { UrlSeal } from './sealed-urls.js'
import { WebhookSecret } from './secret.js'
import { MinuteSpend, type SpendWindow } from './spend.js'

export interface NotifySettings {
  timeoutMs: number
  concurrency: number
  retentionDays: number
  endpointPerMinute: number
  smtp: SmtpSettings | null
}

export interface NotifyDeps {
  store: Store
  registry: Registry
  policies: PolicyStore
  keystore: Keystore
  egress: EgressGuard
  clock: Clock
  log: Logger
  settings: NotifySettings
  /** Where spend_rate reads an agent's spend over a window (default: the notifier's own minute buckets). */
  spendWindow?: SpendWindow
  /** Replicas on one database: their leases, by which each delivery is owned by one replica (queue.ts). */
  owners?: ReplicaLeases
}

/** Alerts, account webhook endpoints, the signing secret, the notifier and its delivery queue. */
export interface Notifications {
  readonly book: AlertBook
  readonly secret: WebhookSecret
  readonly queue: DeliveryQueue
  readonly notifier: Notifier
  readonly smtpConfigured: boolean
  /** Whether the agent exists (a listing filtered by an unknown agent answers 404). */
  agentExists(agentId: string): Promise<boolean>
  /** Deliveries waiting (pending or retrying): for the metrics export. */
  queueDepth(): number
  start(): Promise<void>
  /** Tests: expand every event entry and finish every attempt that is due now. */
  settle(): Promise<void>
  close(): Promise<void>
}

/** How one delivery is attempted, by channel. */
function sender(d: NotifyDeps, secret: WebhookSecret, seal: UrlSeal): Sender {
  const { egress, settings } = d
  return async (x: Delivery) => {
    const c = seal.open(x.channel)
    if (c.type === 'email') {
      if (!settings.smtp) return { status: null, error: 'SMTP is not configured (smtp.url, smtp.from)' }
      return sendEmail(egress, settings.smtp, c.address, JSON.parse(x.body) as Record<string, unknown>, x.id, settings.timeoutMs)
    }
    const headers = c.type === 'webhook' ? webhookHeaders(await secret.get(), x.body, x.id, x.event) : { 'x-paygate-delivery': x.id }
    return postJson(egress, c.url, x.body, headers, settings.timeoutMs)
  }
}

export function buildNotifications(d: NotifyDeps): Notifications {
  const { store } = d
  const spend = new MinuteSpend(store)
  const seal = new UrlSeal(d.keystore)
  const book = new AlertBook(
    d.store,
    d.registry,
    d.clock,
    async (agentId) => [...(await spend.forgetAll(agentId)), { type: 'del', coll: store.collection('alertFired'), key: builtInKey(agentId) }],
    seal,
  )
  const secret = new WebhookSecret(d.store, d.keystore)
  const queue = new DeliveryQueue(d.store, d.clock, d.log, sender(d, secret, seal), {
    ...{ concurrency: d.settings.concurrency, retentionMs: d.settings.retentionDays * 86_400_000, attemptMs: d.settings.timeoutMs },
    ...(d.owners ? { owners: d.owners } : {}),
    cancelled: async (x) => (x.alertId && !(await book.hasAlert(x.alertId)) ? 'alert_deleted' : x.webhookId && !(await book.hasEndpoint(x.webhookId)) ? 'webhook_deleted' : null),
  })
  // What a deleted alert or endpoint still had waiting is dropped at once (not retried for hours to a channel nobody wants).
  book.onRemoved(async (gone) => {
    const match = (x: Delivery): boolean =>
      gone.kind === 'alert' ? x.alertId === gone.alertId : gone.kind === 'agent' ? x.alertId !== null && x.agentId === gone.agentId : x.webhookId === gone.webhookId
    await queue
      .cancel(match, gone.kind === 'webhook' ? 'webhook_deleted' : 'alert_deleted')
      .catch((e: unknown) => d.log.warn({ err: e, ...gone }, 'dropping the deliveries of a deleted alert or endpoint failed'))
  })
  let spendSweep: NodeJS.Timeout | null = null
  const notifier = new Notifier(d.store, book, d.policies, spend, d.spendWindow ?? spend, queue, d.clock, d.log, { endpointPerMinute: d.settings.endpointPerMinute, seal })
  return {
    book,
    secret,
    queue,
    notifier,
    smtpConfigured: d.settings.smtp !== null,
    agentExists: async (agentId) => (await d.registry.getAgent(agentId)) !== undefined,
    queueDepth: () => queue.depth(),
    async start() {
      const sealed = await book.sealLegacy()
      if (sealed) d.log.info({ sealed }, 'notification URLs stored in the clear by an earlier version are now encrypted')
      await Promise.all([book.load(), spend.load()])
      // Replicas: alerts and endpoints changed through another replica are seen within 2 s.
      if (store.backend === 'postgres') {
        book.startRefreshing(2_000, (e) => d.log.warn({ err: e }, 'reloading alerts failed'))
        // Spend buckets of stopped replicas, past 24 h.
        spendSweep = setInterval(() => void spend.sweep(d.clock.now()).catch((e: unknown) => d.log.warn({ err: e }, 'sweeping old spend buckets failed')), 3_600_000)
        spendSweep.unref()
      }
      await queue.start()
      await notifier.start()
    },
    async settle() {
      do {
        await notifier.idle()
        await queue.settle()
        if (notifier.backlog()) await new Promise((r) => setTimeout(r, 10))
      } while (notifier.backlog())
    },
    async close() {
      book.stopRefreshing()
      if (spendSweep) clearInterval(spendSweep)
      await Promise.all([queue.close(), notifier.close()])
    },
  }
}
