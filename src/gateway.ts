import { readFileSync } from 'node:fs'
import type { Server } from 'node:http'
import type { Server as NetServer } from 'node:net'
import { rootCertificates } from 'node:tls'
import type { AddressInfo } from 'node:net'
import { Registry } from './agents/registry.js'
import { ApiRateLimits } from './api/rate-limit.js'
import { Router } from './api/router.js'
import { agentRoutes } from './api/routes/agents.js'
import { caRoutes } from './api/routes/ca.js'
import { healthRoutes } from './api/routes/health.js'
import { policyRoutes } from './api/routes/policies.js'
import { walletRoutes } from './api/routes/wallets.js'
import { payRoutes } from './api/routes/pay.js'
import { transactionRoutes } from './api/routes/transactions.js'
import { LedgerWriter } from './chain/ledger-tx.js'
import { PaymentEngine } from './engine/engine.js'
import { MppAdapter, type MppSettings } from './engine/adapters/mpp.js'
import { PaymentAuthAdapter } from './engine/adapters/payment-auth.js'
import { X402Adapter } from './engine/adapters/x402.js'
import { Idempotency } from './engine/idempotency.js'
import { CardRail, HttpCardProvider, type CardProvider, type Rail } from './engine/rails.js'
import { MppSessions } from './engine/sessions.js'
import { DEFAULT_METHOD_RAILS } from './protocols/mpp.js'
import { Reconciler } from './engine/reconciler.js'
import { Upstream } from './upstream/upstream.js'
import { EgressGuard, type Resolver } from './net/egress.js'
import { EventBus } from './events/bus.js'
import { RecordHooks } from './ledger/record-hooks.js'
import { Outbox } from './ledger/outbox.js'
import { Transactions } from './ledger/transactions.js'
import { CertificateAuthority } from './proxy/ca.js'
import { ProxyServer } from './proxy/server.js'
import { PaygateError } from './errors/index.js'
import { Chain, faucetAmounts } from './chain/chain.js'
import { createApiServer } from './api/server.js'
import type { Config } from './config/load.js'
import type { Logger } from './log/index.js'
import { PolicyStore } from './policy/store.js'
import { Store } from './store/index.js'
import { systemClock, type Clock } from './util/clock.js'
import { Keystore } from './wallet/keystore.js'
import { WalletService } from './wallet/service.js'
import { Wallets } from './wallet/wallets.js'
import { isLoopback, portTaken } from './util/ports.js'

export interface GatewayOptions {
  log: Logger
  clock?: Clock
  /** The MPP card rail's provider (overrides `mpp.cardProviderUrl`). */
  cardProvider?: CardProvider
  /** Extra MPP rails (Lightning, custom), by name. */
  rails?: Rail[]
  /** How the egress guard resolves names (default: dns.lookup); tests inject one. */
  resolver?: Resolver
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
  /** The egress guard every agent connection passes (its counters count denials). */
  readonly egress: EgressGuard
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

/** Listen, naming the config key when the address is taken. */
function listen(server: NetServer, port: number, host: string, key: string): Promise<AddressInfo> {
  return new Promise((resolve, reject) => {
    const failed = (e: NodeJS.ErrnoException): void => reject(e.code === 'EADDRINUSE' ? portTaken(key, host, port) : e)
    server.once('error', failed)
    server.listen(port, host, () => {
      server.off('error', failed)
      resolve(server.address() as AddressInfo)
    })
  })
}

const urlOf = (a: AddressInfo): string => `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`

/** Graceful close: stop accepting, let in-flight requests finish within `graceMs`, then cut. */
async function closeServer(server: Server, graceMs: number): Promise<void> {
  if (!server.listening) return
  const closed = new Promise<void>((resolve) => server.close(() => resolve()))
  server.closeIdleConnections()
  const timer = setTimeout(() => server.closeAllConnections(), graceMs)
  await closed
  clearTimeout(timer)
}

function railsOf(config: Config, opts: GatewayOptions): Map<string, Rail> {
  const rails = new Map<string, Rail>()
  const provider = opts.cardProvider ?? (config.mpp.cardProviderUrl ? new HttpCardProvider(config.mpp.cardProviderUrl, config.mpp.cardProviderKey) : null)
  if (provider) rails.set('card', new CardRail(provider))
  for (const r of opts.rails ?? []) rails.set(r.name, r)
  return rails
}

function mppSettings(config: Config): MppSettings {
  const methods: Record<string, string> = { ...DEFAULT_METHOD_RAILS }
  for (const [k, v] of Object.entries(config.mpp.methods)) methods[k.toLowerCase()] = v
  const rates: Record<string, string> = {}
  for (const [k, v] of Object.entries(config.mpp.rates)) rates[k.toUpperCase()] = v
  return { methods, rates, paymentEndpointHosts: config.mpp.paymentEndpointHosts, sessionTtlSeconds: config.mpp.sessionTtlSeconds, maxAuthorizationSeconds: config.pay.maxAuthorizationSeconds }
}

/** The composition root: build every component from the config and start the listeners. */
export async function startGateway(config: Config, opts: GatewayOptions): Promise<Gateway> {
  const clock = opts.clock ?? systemClock
  const log = opts.log
  const store = await Store.open(config.dataDir, {
    onApplyError: (e) => (e === undefined ? log.info('LevelDB writes work again') : log.error({ err: e }, 'writing into LevelDB failed; retrying (changes are kept in the write-ahead log)')),
  })
  if (store.recovered.batches) log.info({ ...store.recovered }, 'replayed the write-ahead log of the last run into LevelDB')
  let chain: Chain | undefined
  let upstream: Upstream | undefined
  let outbox: Outbox | undefined
  let reconciler: Reconciler | undefined
  let proxy: ProxyServer | undefined
  let api: Server | undefined
  let stopSweeping: (() => void) | undefined
  try {
    if (config.proxy.defaultAgent && !isLoopback(config.proxy.host) && !config.proxy.allowRemoteDefaultAgent) {
      throw new PaygateError('invalid_config', `proxy.defaultAgent is allowed only when the proxy binds to loopback (proxy.host = ${config.proxy.host}); set proxy.allowRemoteDefaultAgent to force it`)
    }
    if (!config.chain.rpcUrl && !isLoopback(config.chain.rpcHost)) {
      log.warn(
        { rpcHost: config.chain.rpcHost },
        "the embedded chain's JSON-RPC is served beyond loopback: anyone who reaches it can use its dev methods (anvil_setBalance, impersonation, evm_* time travel)",
      )
    }
    const registry = new Registry(store, clock, config.accountKey)
    const policies = new PolicyStore(store, registry, clock)
    const accountKey = await registry.bootstrapAccountKey(config.dataDir)
    const { keystore } = await Keystore.open(config.dataDir, config.masterKey, store.collection('meta'))
    chain = await Chain.start(config, { meta: store.collection('chain'), keystore, log })
    const walletStore = new Wallets(store, registry, keystore, clock)
    const wallets = new WalletService(walletStore, chain, faucetAmounts(config.faucet), log)
    const transactions = new Transactions(store)
    // Cost trees read an index by parent; a store from before it gets it built once.
    const indexed = await transactions.indexParents(store.collection('meta'))
    if (indexed) log.info({ entries: indexed }, 'indexed transactions by parent')
    outbox = new Outbox(store, transactions, new LedgerWriter(chain), log, { clock })
    await outbox.start()
    const egress = new EgressGuard({ allow: config.egress.allow, deny: config.egress.deny, log, ...(opts.resolver ? { resolver: opts.resolver } : {}) })
    // Paygate's own listeners, as bound: the chain's now, the API and proxy ports as soon as they listen.
    const chainPort = localChainPort(chain, chain.embedded ? chain.info.rpcUrl : config.chain.rpcUrl!)
    if (chainPort !== null) egress.protect(chainPort)
    egress.protect(config.api.port, config.proxy.port)
    upstream = new Upstream(config.upstream.caFile, egress, config.pay.timeoutMs)
    const events = new EventBus()
    const hooks = new RecordHooks()
    const rails = railsOf(config, opts)
    const settings = mppSettings(config)
    const mpp = new MppAdapter(upstream, new MppSessions(store, registry, clock), rails, settings, clock)
    const paymentAuth = new PaymentAuthAdapter(upstream, rails.get('card') ?? null, settings.rates, clock, config.pay.maxAuthorizationSeconds)
    const adapters = [new X402Adapter(upstream, config.pay.maxAuthorizationSeconds), mpp, paymentAuth]
    const engine = new PaymentEngine({
      ...{ store, registry, policies, wallets: walletStore, chain, upstream, transactions, outbox, events, hooks, clock, log },
      ...{ adapters, mpp, acceptPayment: paymentAuth.acceptPayment },
    })
    reconciler = new Reconciler(engine, chain, transactions, clock, log)
    reconciler.start()
    const idempotency = new Idempotency(store, clock, config.pay.idempotencyTtlHours * 3_600_000)
    stopSweeping = idempotency.startSweeping()

    const router = new Router().add(
      ...healthRoutes([
        { name: 'store', check: async () => store.status === 'open' && store.applyError === undefined },
        { name: 'chain', check: async () => (await chain!.blockNumber()) >= 0n },
      ]),
      ...agentRoutes(registry),
      ...policyRoutes(policies),
      ...walletRoutes(wallets, chain),
      ...payRoutes(engine, idempotency),
      ...transactionRoutes(transactions),
    )
    api = createApiServer({
      router,
      registry,
      rateLimit: new ApiRateLimits(config.api.rateLimit, clock),
      log,
      maxBodyBytes: config.api.maxBodyBytes,
      requestTimeoutMs: config.api.requestTimeoutMs,
    })
    const ca = await CertificateAuthority.load(config.certsDir)
    proxy = new ProxyServer({
      engine,
      registry,
      upstream,
      ca,
      idempotency,
      log,
      maxBufferBytes: config.proxy.maxBufferBytes,
      bufferTimeoutMs: config.proxy.bufferTimeoutMs,
      defaultAgent: config.proxy.defaultAgent,
      passThrough: config.proxy.passThrough,
      accessLog: config.proxy.accessLog,
      idleTimeoutMs: config.proxy.idleTimeoutMs,
      ...(config.upstream.caFile ? { upstreamCa: [...rootCertificates, readFileSync(config.upstream.caFile, 'utf8')] } : {}),
    })
    router.add(...caRoutes(ca))
    const addr = await listen(api, config.api.port, config.api.host, 'api.port')
    egress.protect(addr.port)
    const proxyAddr = await listen(proxy.server, config.proxy.port, config.proxy.host, 'proxy.port')
    egress.protect(proxyAddr.port)

    let closing: Promise<void> | undefined
    return {
      config,
      store,
      registry,
      policies,
      chain,
      wallets,
      engine,
      transactions,
      outbox,
      events,
      hooks,
      reconciler,
      proxy,
      ca,
      egress,
      apiUrl: urlOf(addr),
      proxyUrl: urlOf(proxyAddr),
      accountKey,
      close: () =>
        (closing ??= (async () => {
          await Promise.all([closeServer(api!, config.shutdown.graceMs), proxy!.close(config.shutdown.graceMs)])
          stopSweeping!()
          await reconciler!.close()
          await outbox!.close()
          await upstream!.close()
          await chain!.close()
          await store.close()
        })()),
    }
  } catch (e) {
    stopSweeping?.()
    if (api) await closeServer(api, 0)
    await proxy?.close(0)
    await reconciler?.close()
    await outbox?.close()
    await upstream?.close()
    await chain?.close()
    await store.close()
    throw e
  }
}
