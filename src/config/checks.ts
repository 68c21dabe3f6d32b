import { accessSync, constants } from 'node:fs'
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

/** Two listeners of this process given one port: the second would report it taken, as if by something else. */
export function checkPorts(config: Config): void {
  const ports: [string, number][] = [
    ['api.port', config.api.port],
    ['proxy.port', config.proxy.port],
    ...(config.chain.rpcUrl ? [] : ([['chain.rpcPort', config.chain.rpcPort]] as [string, number][])),
  ]
  for (const [i, [a, p]] of ports.entries()) {
    const same = ports.slice(i + 1).find(([, q]) => q === p && p !== 0)
    if (same) throw new PaygateError('invalid_config', `${a} and ${same[0]} are both ${p}: each listener needs its own port (0 picks a free one)`)
  }
}

/** An anvil binary named by chain.anvilPath must be there: anvil that cannot start says only that it exited. */
export function checkAnvilPath(config: Config): void {
  const bin = config.chain.anvilPath
  if (!bin || config.chain.rpcUrl) return
  try {
    accessSync(bin, constants.X_OK)
  } catch (e) {
    throw new PaygateError('invalid_config', `chain.anvilPath = ${bin} (PAYGATE_CHAIN_ANVIL_PATH): not an executable file (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`)
  }
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
