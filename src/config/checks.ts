import { PaygateError } from '../errors/index.js'
import type { Logger } from '../log/index.js'
import { isLoopback } from '../util/ports.js'
import type { Config } from './load.js'

// Start-up checks of a loaded config that need more than one setting: refusals, and warnings.

/**
 * On PostgreSQL every replica must decrypt the same wallet keys and pay on the same chain: a
 * start without the shared master key or with the embedded chain (each replica its own) is
 * refused before anything is opened.
 */
export function checkSharedStore(config: Config): void {
  if (!config.store.postgresUrl) return
  const missing = [
    ...(config.masterKey ? [] : ['masterKey (PAYGATE_MASTER_KEY), the same on every replica']),
    ...(config.chain.rpcUrl ? [] : ['chain.rpcUrl (PAYGATE_CHAIN_RPC_URL) with chain.token and chain.ledger: an external chain, since an embedded one is per replica']),
  ]
  if (missing.length) throw new PaygateError('invalid_config', `with store.postgresUrl (state shared by replicas), set ${missing.join('; and ')}`)
}

/** Refuse a config that would expose a default agent, and warn about a reachable dev chain. */
export function checkExposure(config: Config, log: Logger): void {
  if (config.proxy.defaultAgent && !isLoopback(config.proxy.host) && !config.proxy.allowRemoteDefaultAgent) {
    throw new PaygateError('invalid_config', `proxy.defaultAgent is allowed only when the proxy binds to loopback (proxy.host = ${config.proxy.host}); set proxy.allowRemoteDefaultAgent to force it`)
  }
  if (!config.chain.rpcUrl && !isLoopback(config.chain.rpcHost)) {
    log.warn(
      { rpcHost: config.chain.rpcHost },
      "the embedded chain's JSON-RPC is served beyond loopback: anyone who reaches it can use its dev methods (anvil_setBalance, impersonation, evm_* time travel)",
    )
  }
}
