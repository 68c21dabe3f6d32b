import { readFileSync } from 'node:fs'
import type { Server } from 'node:http'
import { rootCertificates } from 'node:tls'
import { Registry } from './agents/registry.js'
import { ApiRateLimits } from './api/rate-limit.js'
import { Router } from './api/router.js'
import { agentRoutes } from './api/routes/agents.js'
import { caRoutes } from './api/routes/ca.js'
import { healthRoutes } from './api/routes/health.js'
import { openapiRoutes } from './api/routes/openapi.js'
import { metricsRoutes, prometheusRoute } from './api/routes/metrics.js'
import { policyRoutes } from './api/routes/policies.js'
import { walletRoutes } from './api/routes/wallets.js'
import { payRoutes } from './api/routes/pay.js'
import { transactionRoutes } from './api/routes/transactions.js'
import { invokeRoutes } from './api/routes/invoke.js'
import { runRoutes } from './api/routes/runs.js'
import { InvocationRunner } from './invoke/runner.js'
import { closeInterrupted, closeOrphaned } from './invoke/recover.js'
import { InvocationBook } from './policy/invocations.js'
import { alertRoutes } from './api/routes/alerts.js'
import { deliveryRoutes } from './api/routes/deliveries.js'
import { webhookRoutes } from './api/routes/webhooks.js'
import { buildNotifications, type Notifications } from './notify/index.js'
import { LedgerWriter } from './chain/ledger-tx.js'
import { PaymentEngine } from './engine/engine.js'
import { MppAdapter } from './engine/adapters/mpp.js'
import { PaymentAuthAdapter } from './engine/adapters/payment-auth.js'
import { X402Adapter } from './engine/adapters/x402.js'
import { Idempotency } from './engine/idempotency.js'
import type { CardProvider, Rail } from './engine/rails.js'
import { MppSessions } from './engine/sessions.js'
import { Reconciler } from './engine/reconciler.js'
import { Upstream } from './upstream/upstream.js'
import { EgressGuard, type Resolver } from './net/egress.js'
import { EventBus } from './events/bus.js'
import { RecordHooks } from './ledger/record-hooks.js'
import { Aggregates } from './metrics/aggregates.js'
import { PrometheusMetrics } from './metrics/prometheus.js'
import { Outbox } from './ledger/outbox.js'
import { Transactions } from './ledger/transactions.js'
import { CertificateAuthority } from './proxy/ca.js'
import { ProxyServer } from './proxy/server.js'
import { Chain, faucetAmounts } from './chain/chain.js'
import { createApiServer } from './api/server.js'
import { DashboardAssets } from './api/dashboard.js'
import { summaryRoutes } from './api/routes/summary.js'
import { checkAnvilPath, checkExposure, checkPorts, checkSharedStore } from './config/checks.js'
import type { Config } from './config/load.js'
import type { Logger } from './log/index.js'
import { PolicyStore } from './policy/store.js'
import { makeDataDir, Store } from './store/index.js'
import { CrossLocks } from './store/leases.js'
import { systemClock, type Clock } from './util/clock.js'
import { Keystore } from './wallet/keystore.js'
import { WalletService } from './wallet/service.js'
import { Wallets } from './wallet/wallets.js'
import { isLoopback } from './util/ports.js'
import { closeServer, listen, urlOf } from './util/listen.js'
import { mppSettings, railsOf } from './engine/settings.js'

export interface GatewayOptions {
  log: Logger
  clock?: Clock
  /** The MPP card rail's provider (overrides `mpp.cardProviderUrl`). */
  cardProvider?: CardProvider
  /** Extra MPP rails (Lightning, custom), by name. */
  rails?: Rail[]
  /** Where the built dashboard is (default `dist/web` in the package). */
  dashboardDir?: string
  /** How the egress guard resolves names (default: dns.lookup); tests inject one. */
  resolver?: Resolver
  /** Sign ledger records on the embedded chain too, as an external chain gets them (tests of that path). */
  signedLedger?: boolean
}

export interface Gateway {
  readonly config: Config
  readonly store: Store
  readonly registry: Registry
  readonly policies: PolicyStore
  readonly chain: Chain
  readonly wallets: WalletService
  readonly engine: PaymentEngine
  readonly transactions: Transactions
  readonly outbox: Outbox
  readonly events: EventBus
  /** The record hook: contributors keep their state in the same write as each transaction record. */
  readonly hooks: RecordHooks
  readonly reconciler: Reconciler
  readonly proxy: ProxyServer
  readonly ca: CertificateAuthority
  /** Alerts, webhook endpoints and the delivery queue (`notify.queueDepth()` for the metrics gauge). */
  readonly notify: Notifications
  /** The egress guard every agent connection passes (its counters count denials). */
  readonly egress: EgressGuard
  /** Per-agent aggregates (the metrics API) and the Prometheus registry (`registerGauge` for other features' gauges). */
  readonly metrics: { aggregates: Aggregates; prometheus: PrometheusMetrics }
  /** The API port's routes (the OpenAPI contract test holds docs/openapi.json to them). */
  readonly routes: Router['list']
  /** Base URL of the API port, e.g. http://127.0.0.1:8403 */
  readonly apiUrl: string
  /** Address of the forward-proxy port, e.g. http://127.0.0.1:8402 */
  readonly proxyUrl: string
  /** First-start account key bootstrap: where the key file is, and the key when just created. */
  readonly accountKey: { file: string; created: boolean; apiKey: string | null }
  close(): Promise<void>
}

/**
 * The port of the chain's JSON-RPC when it is this host's (the embedded chain, or a node the
 * operator runs on loopback): an agent must never reach it through Paygate (its dev methods
 * move anyone's funds).
 */
function localChainPort(chain: Chain, rpcUrl: string): number | null {
  let u: URL
  try {
    u = new URL(rpcUrl)
  } catch {
    return null
  }
  const host = u.hostname.replace(/^\[|\]$/g, '')
  if (!chain.embedded && !isLoopback(host) && host !== '0.0.0.0' && host !== '::') return null
  return Number(u.port) || (u.protocol === 'https:' || u.protocol === 'wss:' ? 443 : 80)
}

/** What the builders share: the config, the options, and the clock and log from them. */
interface Ctx {
  config: Config
  opts: GatewayOptions
  log: Logger
  clock: Clock
}

/** What a start has set running, filled in as it goes, so that a failed start stops exactly that. */
interface Started {
  store: Store
  chain?: Chain
  upstream?: Upstream
  outbox?: Outbox
  reconciler?: Reconciler
  proxy?: ProxyServer
  api?: Server
  notify?: Notifications
  prometheus?: PrometheusMetrics
  stopSweeping?: () => void
  /** Ends this replica's lease (shared store only), so others settle what it leaves at once. */
  releaseReplica?: () => Promise<void>
  stopFolding?: () => Promise<void>
  /** Writes the metrics counted since their last checkpoint (LevelDB), once no record is written any more. */
  flushMetrics?: () => Promise<void>
}

/**
 * Stop what was started, in order: both listeners drain within `graceMs` (0 for a failed start:
 * nothing was served yet), then the rest. Whatever a failed start did not reach is skipped.
 */
async function closeStarted(s: Started, graceMs: number): Promise<void> {
  await Promise.all([s.api && closeServer(s.api, graceMs), s.proxy?.close(graceMs)])
  // Sends still out after the grace are cut first, so the work waiting on them ends while all below is open.
  await s.upstream?.close()
  s.stopSweeping?.()
  await s.notify?.close()
  s.prometheus?.close()
  await s.reconciler?.close()
  await s.releaseReplica?.()
  await s.outbox?.close()
  await s.stopFolding?.()
  await s.flushMetrics?.()
  await s.chain?.close()
  await s.store.close()
}

/** The store the config names, its shared-store requirements checked before anything is opened. */
async function openStore({ config, log }: Ctx): Promise<Store> {
  checkSharedStore(config)
  checkPorts(config)
  checkAnvilPath(config)
  // On PostgreSQL too it holds this replica's files (the account key, the CA): a fresh clone has none.
  makeDataDir(config.dataDir)
  const store = await Store.open(config.dataDir, {
    ...(config.store.postgresUrl ? { postgresUrl: config.store.postgresUrl } : {}),
    onApplyError: (e) => (e === undefined ? log.info('LevelDB writes work again') : log.error({ err: e }, 'writing into LevelDB failed; retrying (changes are kept in the write-ahead log)')),
  })
  if (store.recovered.batches) log.info({ ...store.recovered }, 'replayed the write-ahead log of the last run into LevelDB')
  if (store.backend === 'postgres') log.info('state in PostgreSQL (store.postgresUrl), shared with every replica that names it')
  return store
}

/** Agents, policies, keys, the chain, wallets and the transaction ledger with its outbox. */
async function buildLedger({ config, opts, log, clock }: Ctx, s: Started) {
  const { store } = s
  const registry = new Registry(store, clock, config.accountKey)
  const policies = new PolicyStore(store, registry, clock)
  // One-time setup (master key check, chain signer) runs once across replicas; the account key after the listeners.
  const { keystore, commitKeys, chain } = await store.withInitLock(async () => {
    const { keystore, commit: commitKeys } = await Keystore.open(config.dataDir, config.masterKey, store.collection('meta'))
    const chain = (s.chain = await Chain.start(config, { meta: store.collection('chain'), keystore, log, signedLedger: opts.signedLedger === true }))
    return { keystore, commitKeys, chain }
  })
  const walletStore = new Wallets(store, registry, keystore, clock)
  const wallets = new WalletService(walletStore, chain, faucetAmounts(config.faucet), log)
  const transactions = new Transactions(store)
  // Cost trees read an index by parent; a store from before it gets it built once.
  const indexed = await transactions.indexParents(store.collection('meta'))
  if (indexed) log.info({ entries: indexed }, 'indexed transactions by parent')
  // Before anything writes records: the aggregates are loaded, or built once from the records (replicas: rows of their own).
  const locks = new CrossLocks(store, clock)
  const aggregates = new Aggregates(store, clock, store.backend === 'postgres' ? locks : null)
  aggregates.onCheckpointError = (err) => log.warn({ err }, 'writing the metrics buckets failed; retrying at the next checkpoint')
  const built = await aggregates.start(transactions, store.collection('meta'))
  if (built.backfilled !== null) log.info({ records: built.backfilled, buckets: built.buckets }, 'built the metrics aggregates from the stored transactions')
  if (built.replayed) log.info({ rows: built.replayed }, 'counted the metrics changes the last run left unwritten')
  s.flushMetrics = () => aggregates.flush()
  s.stopFolding = aggregates.startFolding((err) => log.warn({ err }, "folding a stopped replica's metrics rows failed; retrying"))
  const outbox = (s.outbox = new Outbox(store, transactions, new LedgerWriter(chain, { thread: true, log }), log, { clock }))
  await outbox.start()
  return { store, registry, policies, commitKeys, keystore, chain, walletStore, wallets, transactions, outbox, aggregates, locks }
}
type Ledger = Awaited<ReturnType<typeof buildLedger>>

/** The egress guard, protecting Paygate's own ports: the chain's now, the API and proxy ports as configured (and again as bound). */
function egressGuard({ config, opts, log }: Ctx, chain: Chain): EgressGuard {
  const egress = new EgressGuard({ allow: config.egress.allow, deny: config.egress.deny, log, ...(opts.resolver ? { resolver: opts.resolver } : {}) })
  const chainPort = localChainPort(chain, chain.embedded ? chain.info.rpcUrl : config.chain.rpcUrl!)
  if (chainPort !== null) egress.protect(chainPort)
  if (chain.embedded) {
    // anvil's own HTTP JSON-RPC (a random loopback port) has the same dev methods as the chain's port.
    const anvil = chain.anvilPorts()
    if (anvil.length) egress.protect(...anvil)
    else log.warn("could not read the embedded chain's anvil port from /proc: agents are not kept from it; deny loopback with egress.deny")
  }
  egress.protect(config.api.port, config.proxy.port)
  return egress
}

/** The one payment engine with its protocol adapters and rails, its reconciler and idempotency keys. */
function buildEngine(ctx: Ctx, l: Ledger, egress: EgressGuard, s: Started) {
  const { config, opts, log, clock } = ctx
  const upstream = (s.upstream = new Upstream(config.upstream.caFile, egress, config.pay.timeoutMs))
  const events = new EventBus()
  const hooks = new RecordHooks()
  const { locks } = l
  // Invocation caps follow their payments' records in the same writes (shared: read fresh under locks).
  const shared = locks.shared ? { owner: locks.replicaId, payments: (ids: string[]) => l.transactions.records.getMany(ids), alive: (id: string) => locks.alive(id) } : null
  const invocations = new InvocationBook(l.store, shared)
  if (!shared) hooks.add(invocations.contributor)
  hooks.add(l.aggregates.contributor)
  hooks.addPreparer(l.aggregates.prepare)
  const rails = railsOf(config, opts)
  const settings = mppSettings(config)
  const mpp = new MppAdapter(upstream, new MppSessions(l.store, l.registry, clock), rails, settings, clock)
  const paymentAuth = new PaymentAuthAdapter(upstream, rails.get('card') ?? null, settings.rates, clock, config.pay.maxAuthorizationSeconds)
  const adapters = [new X402Adapter(upstream, config.pay.maxAuthorizationSeconds), mpp, paymentAuth]
  const engine = new PaymentEngine({
    ...{ store: l.store, registry: l.registry, policies: l.policies, wallets: l.walletStore, chain: l.chain, upstream, transactions: l.transactions, outbox: l.outbox, events, hooks, clock, log },
    ...{ adapters, mpp, acceptPayment: paymentAuth.acceptPayment, invocations, locks },
  })
  const runner = new InvocationRunner({
    ...{ engine, book: invocations, registry: l.registry, policies: l.policies, wallets: l.walletStore, transactions: l.transactions, outbox: l.outbox },
    ...{ events, clock, timeoutMs: config.invoke.timeoutMs },
  })
  const reconciler = (s.reconciler = new Reconciler(engine, l.chain, l.transactions, clock, log))
  if (shared) reconciler.alsoEachPass(() => closeOrphaned(invocations, runner, log))
  s.releaseReplica = locks.holdReplicaLease()
  reconciler.start()
  const idempotency = new Idempotency(l.store, clock, config.pay.idempotencyTtlHours * 3_600_000, locks)
  s.stopSweeping = idempotency.startSweeping()
  return { upstream, events, hooks, engine, reconciler, idempotency, invocations, runner }
}
type Paying = ReturnType<typeof buildEngine>

/** Notifications: alerts, webhook endpoints, the notifier on the record hook, the delivery queue on disk. */
async function buildNotify({ config, log, clock }: Ctx, l: Ledger, p: Paying, egress: EgressGuard, s: Started): Promise<Notifications> {
  // smtp.url without smtp.from (or the reverse) is refused when the config is loaded (config/load.ts).
  const { smtp } = config
  const notify = (s.notify = buildNotifications({
    ...{ store: l.store, registry: l.registry, policies: l.policies, keystore: l.keystore, egress, clock, log },
    ...(l.locks.shared ? { owners: l.locks } : {}), // replicas: a delivery is its creator's while its lease lives
    settings: { ...config.notify, smtp: smtp.url && smtp.from ? { url: smtp.url, from: smtp.from } : null },
  }))
  await notify.start()
  p.hooks.add(notify.notifier.contributor)
  return notify
}

/** The /v1 router (the CA's routes are added once the CA is loaded) and the API server. */
function buildApi({ config, log, clock, opts }: Ctx, l: Ledger, p: Paying, notify: Notifications, prom: PrometheusMetrics): { router: Router; api: Server } {
  const router = new Router().add(
    // First: matched before anything the dashboard serves under `/`.
    prometheusRoute(prom, config.metrics.requireKey),
    ...invokeRoutes(p.runner, p.invocations, p.idempotency),
    ...healthRoutes([
      { name: 'store', check: async () => l.store.status === 'open' && l.store.applyError === undefined },
      { name: 'chain', check: async () => (await l.chain.blockNumber()) >= 0n },
    ]),
    ...agentRoutes(l.registry),
    ...policyRoutes(l.policies),
    ...walletRoutes(l.wallets, l.chain),
    ...payRoutes(p.engine, p.idempotency),
    ...transactionRoutes(l.transactions, l.chain.info, async (id) => (await l.registry.getAgent(id)) !== undefined),
    ...openapiRoutes(),
    ...runRoutes(p.invocations, l.transactions),
    ...summaryRoutes({ store: l.store, chain: l.chain, outbox: l.outbox }),
    ...alertRoutes(notify),
    ...webhookRoutes(notify),
    ...deliveryRoutes(notify),
    ...metricsRoutes({ aggregates: l.aggregates, registry: l.registry, policies: l.policies, clock }),
  )
  const api = createApiServer({
    router,
    registry: l.registry,
    rateLimit: new ApiRateLimits(config.api.rateLimit, clock),
    log,
    maxBodyBytes: config.api.maxBodyBytes,
    requestTimeoutMs: config.api.requestTimeoutMs,
    ...(config.api.dashboard ? { dashboard: new DashboardAssets(opts.dashboardDir) } : {}),
  })
  return { router, api }
}

function buildProxy({ config, log }: Ctx, l: Ledger, p: Paying, ca: CertificateAuthority): ProxyServer {
  return new ProxyServer({
    engine: p.engine,
    registry: l.registry,
    upstream: p.upstream,
    ca,
    idempotency: p.idempotency,
    log,
    maxBufferBytes: config.proxy.maxBufferBytes,
    bufferTimeoutMs: config.proxy.bufferTimeoutMs,
    defaultAgent: config.proxy.defaultAgent,
    passThrough: config.proxy.passThrough,
    accessLog: config.proxy.accessLog,
    idleTimeoutMs: config.proxy.idleTimeoutMs,
    ...(config.upstream.caFile ? { upstreamCa: [...rootCertificates, readFileSync(config.upstream.caFile, 'utf8')] } : {}),
  })
}

/** The composition root: build every component from the config and start the listeners. */
export async function startGateway(config: Config, opts: GatewayOptions): Promise<Gateway> {
  const ctx: Ctx = { config, opts, log: opts.log, clock: opts.clock ?? systemClock }
  const s: Started = { store: await openStore(ctx) }
  try {
    checkExposure(ctx.config, ctx.log)
    const ledger = await buildLedger(ctx, s)
    const egress = egressGuard(ctx, ledger.chain)
    const paying = buildEngine(ctx, ledger, egress, s)
    const interrupted = await closeInterrupted(paying.invocations, paying.runner, ledger.transactions)
    if (interrupted) ctx.log.warn({ invocations: interrupted }, 'closed invocations left open by the last run as interrupted')
    const notify = await buildNotify(ctx, ledger, paying, egress, s)
    // Its proxy gauges are read when scraped, once the proxy below exists.
    const prometheus = (s.prometheus = new PrometheusMetrics(
      {
        get proxy() {
          return s.proxy!
        },
        egress,
        outbox: ledger.outbox,
      },
      { agentLabels: config.metrics.agentLabels },
    ))
    prometheus.registerGauge('paygate_delivery_queue_depth', 'Notification deliveries waiting to be sent (pending or retrying).', () => notify.queueDepth())
    const { router, api } = buildApi(ctx, ledger, paying, notify, prometheus)
    s.api = api
    const ca = await CertificateAuthority.forStore(s.store, config.certsDir, ledger.keystore)
    const proxy = (s.proxy = buildProxy(ctx, ledger, paying, ca))
    router.add(...caRoutes(ca))
    const addr = await listen(api, config.api.port, config.api.host, 'api.port')
    egress.protect(addr.port)
    const proxyAddr = await listen(proxy.server, config.proxy.port, config.proxy.host, 'proxy.port')
    egress.protect(proxyAddr.port)
    // Key files only once nothing else can fail: a failed start leaves none that would change
    // the next (which then makes and shows the account key as a first start does).
    ledger.commitKeys()
    const accountKey = await s.store.withInitLock(() => ledger.registry.bootstrapAccountKey(config.dataDir))

    const { registry, policies, chain, wallets, transactions, outbox } = ledger
    const { engine, events, hooks, reconciler } = paying
    let closing: Promise<void> | undefined
    return {
      ...{ config, store: s.store, registry, policies, chain, wallets, engine, transactions, outbox, events, hooks, reconciler, proxy, ca, egress, accountKey, notify },
      metrics: { aggregates: ledger.aggregates, prometheus },
      routes: () => router.list(),
      apiUrl: urlOf(addr),
      proxyUrl: urlOf(proxyAddr),
      close: () => (closing ??= closeStarted(s, config.shutdown.graceMs)),
    }
  } catch (e) {
    await closeStarted(s, 0)
    throw e
  }
}
