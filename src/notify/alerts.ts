import type { Registry } from '../agents/registry.js'
import { PaygateError, notFound } from '../errors/index.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { randomBase62 } from '../util/random.js'
import type { Fired } from './fire.js'
import { type UrlSeal, unsealed } from './sealed-urls.js'
import { MAX_ALERTS_PER_AGENT, MAX_WEBHOOK_ENDPOINTS, type Alert, type AlertInput, type SpecEvent, type WebhookEndpoint } from './model.js'

/** What was deleted: one alert, every alert of a deleted agent, or an account endpoint. */
export type Removed = { kind: 'alert'; alertId: string } | { kind: 'agent'; agentId: string } | { kind: 'webhook'; webhookId: string }

/**
 * Alerts per agent and the account's webhook endpoints, in the store and held in memory
 * (loaded once at start): the notifier reads them per event without a store read. An
 * agent's alerts and their fired state go in the same batch as the agent's delete.
 * Replicas on one database: each reloads them every `REFRESH_MS` (`startRefreshing`), so an
 * alert or endpoint changed through another replica is seen here within that time.
 */
export class AlertBook {
  readonly alertsColl: Collection<Alert>
  readonly endpointsColl: Collection<WebhookEndpoint>
  readonly firedColl: Collection<Fired>
  private alerts = new Map<string, Alert>()
  private endpoints = new Map<string, WebhookEndpoint>()
  /** Counts this process's changes: a reload that overlapped one is done again (it may have missed it). */
  private changes = 0
  private refresher: NodeJS.Timeout | null = null
  private readonly removed: ((gone: Removed) => Promise<void>)[] = []

  constructor(
    private readonly store: Store,
    private readonly registry: Registry,
    private readonly clock: Clock,
    onAgentGone: (agentId: string) => BatchOp[] | Promise<BatchOp[]>,
    private readonly seal: UrlSeal,
  ) {
    this.alertsColl = store.collection('alerts')
    this.endpointsColl = store.collection('webhookEndpoints')
    this.firedColl = store.collection('alertFired')
    registry.onAgentDelete(
      async (agentId) => [
        ...(await this.ofAgentStored(agentId)).flatMap((a): BatchOp[] => [
          { type: 'del', coll: this.alertsColl as Collection<unknown>, key: a.alertId },
          { type: 'del', coll: this.firedColl as Collection<unknown>, key: a.alertId },
        ]),
        ...(await onAgentGone(agentId)),
      ],
      (agentId) => {
        for (const a of this.ofAgent(agentId)) this.alerts.delete(a.alertId)
        this.changes++
        // The delete's answer does not wait for this (the registry's hook is synchronous).
        void this.tell({ kind: 'agent', agentId })
      },
    )
  }

  /** `fn` runs once an alert, an agent's alerts, or an account endpoint are deleted (it must not throw). */
  onRemoved(fn: (gone: Removed) => Promise<void>): void {
    this.removed.push(fn)
  }

  private async tell(gone: Removed): Promise<void> {
    for (const fn of this.removed) await fn(gone)
  }

  /** Whether the alert exists: with replicas also one made through another replica and not loaded here yet. */
  async hasAlert(alertId: string): Promise<boolean> {
    return this.alerts.has(alertId) || (await this.alertsColl.get(alertId)) !== undefined
  }

  async hasEndpoint(webhookId: string): Promise<boolean> {
    return this.endpoints.has(webhookId) || (await this.endpointsColl.get(webhookId)) !== undefined
  }

  async load(): Promise<void> {
    for (let tries = 0; tries < 3; tries++) {
      const before = this.changes
      const alerts = new Map<string, Alert>()
      const endpoints = new Map<string, WebhookEndpoint>()
      for await (const [id, a] of this.alertsColl.entries()) alerts.set(id, { ...a, notify: this.seal.open(a.notify) })
      for await (const [id, w] of this.endpointsColl.entries()) endpoints.set(id, this.seal.openEndpoint(w))
      if (before !== this.changes && tries < 2) continue
      this.alerts = alerts
      this.endpoints = endpoints
      return
    }
  }

  private stored(a: Alert): Alert {
    return { ...a, notify: this.seal.seal(a.notify) }
  }

  /**
   * Seal the URLs of alerts and endpoints stored before URLs were sealed (sealed-urls.ts); the
   * number sealed. Each row is rewritten only if it is still as it was read (under a lock of its
   * own, against another replica's start doing the same).
   */
  async sealLegacy(): Promise<number> {
    const alerts: [string, Alert][] = []
    const endpoints: [string, WebhookEndpoint][] = []
    for await (const [id, a] of this.alertsColl.entries()) if (unsealed(a.notify)) alerts.push([id, a])
    for await (const [id, w] of this.endpointsColl.entries()) if (unsealed(w)) endpoints.push([id, w])
    let n = 0
    for (const [id, a] of alerts) n += await this.rewrite(this.alertsColl, id, a, this.stored(a))
    for (const [id, w] of endpoints) n += await this.rewrite(this.endpointsColl, id, w, this.seal.sealEndpoint(w))
    return n
  }

  private async rewrite<T>(coll: Collection<T>, id: string, was: T, next: T): Promise<number> {
    const { result, written } = await this.store.transact(`notify\u0000seal\u0000${id}`, async () => {
      const now = await coll.get(id)
      if (JSON.stringify(now) !== JSON.stringify(was)) return { ops: [], result: 0 }
      return { ops: [{ type: 'put' as const, coll: coll as Collection<unknown>, key: id, value: next }], result: 1 }
    })
    const w = await written
    if (!w.ok) throw w.error
    return result
  }

  /** Replicas: reload every `ms` until `stopRefreshing`. */
  startRefreshing(ms: number, onError: (e: unknown) => void): void {
    this.refresher = setInterval(() => void this.load().catch(onError), ms)
    this.refresher.unref()
  }

  stopRefreshing(): void {
    if (this.refresher) clearInterval(this.refresher)
  }

  all(): Alert[] {
    return [...this.alerts.values()]
  }

  /** An agent's alerts for its delete: with replicas from the store (one made through another replica may not be loaded here yet). */
  private async ofAgentStored(agentId: string): Promise<Alert[]> {
    if (this.store.backend !== 'postgres') return this.ofAgent(agentId)
    const out: Alert[] = []
    for await (const [, a] of this.alertsColl.entries()) if (a.agentId === agentId) out.push(a)
    return out
  }

  ofAgent(agentId: string): Alert[] {
    return [...this.alerts.values()].filter((a) => a.agentId === agentId)
  }

  get(alertId: string): Alert {
    const a = this.alerts.get(alertId)
    if (!a) throw notFound(`alert ${alertId}`)
    return a
  }

  async create(input: AlertInput): Promise<Alert> {
    return this.registry.withAgent(input.agentId, async () => {
      if (this.ofAgent(input.agentId).length >= MAX_ALERTS_PER_AGENT) throw new PaygateError('conflict', `an agent has at most ${MAX_ALERTS_PER_AGENT} alerts`)
      const alert: Alert = { alertId: `al_${randomBase62(16)}`, ...input, createdAt: new Date(this.clock.now()).toISOString() }
      await this.alertsColl.put(alert.alertId, this.stored(alert))
      this.alerts.set(alert.alertId, alert)
      this.changes++
      return alert
    })
  }

  /** Replace an alert's settings; its fired state starts over (a changed alert is judged anew). */
  async update(alertId: string, input: AlertInput): Promise<Alert> {
    const prev = this.get(alertId)
    return this.registry.withAgent(prev.agentId, async () => {
      const next: Alert = { alertId, ...input, agentId: prev.agentId, createdAt: prev.createdAt }
      await this.store.batch([
        { type: 'put', coll: this.alertsColl as Collection<unknown>, key: alertId, value: this.stored(next) },
        { type: 'del', coll: this.firedColl as Collection<unknown>, key: alertId },
      ])
      this.alerts.set(alertId, next)
      this.changes++
      return next
    })
  }

  async remove(alertId: string): Promise<void> {
    this.get(alertId)
    await this.store.batch([
      { type: 'del', coll: this.alertsColl as Collection<unknown>, key: alertId },
      { type: 'del', coll: this.firedColl as Collection<unknown>, key: alertId },
    ])
    this.alerts.delete(alertId)
    this.changes++
    await this.tell({ kind: 'alert', alertId })
  }

  listEndpoints(): WebhookEndpoint[] {
    return [...this.endpoints.values()].sort((a, b) => a.createdAt.localeCompare(b.createdAt))
  }

  endpoint(webhookId: string): WebhookEndpoint {
    const w = this.endpoints.get(webhookId)
    if (!w) throw notFound(`webhook ${webhookId}`)
    return w
  }

  async addEndpoint(url: string, events: SpecEvent[]): Promise<WebhookEndpoint> {
    if (this.endpoints.size >= MAX_WEBHOOK_ENDPOINTS) throw new PaygateError('conflict', `the account has at most ${MAX_WEBHOOK_ENDPOINTS} webhook endpoints`)
    const w: WebhookEndpoint = { webhookId: `wh_${randomBase62(16)}`, url, events, createdAt: new Date(this.clock.now()).toISOString() }
    await this.endpointsColl.put(w.webhookId, this.seal.sealEndpoint(w))
    this.endpoints.set(w.webhookId, w)
    this.changes++
    return w
  }

  async removeEndpoint(webhookId: string): Promise<void> {
    this.endpoint(webhookId)
    await this.endpointsColl.del(webhookId)
    this.endpoints.delete(webhookId)
    this.changes++
    await this.tell({ kind: 'webhook', webhookId })
  }
}
