import { deployExternal } from './chain/chain.js'
import { loadConfig, secretTexts, type Config } from './config/load.js'
import { PaygateError, isPaygateError } from './errors/index.js'
import { startGateway } from './gateway.js'
import { createLogger, hideInLogs, scrubSecrets } from './log/index.js'
import { CertificateAuthority } from './proxy/ca.js'
import { Store } from './store/index.js'
import { Keystore } from './wallet/keystore.js'

const USAGE = `usage: paygate [command] [--flags]
  start                         start the gateway (default)
  deploy-ledger [--with-token]  deploy a PaymentLedger (and a dev USDC token) on chain.rpcUrl
                                with the service signer; prints the addresses as JSON
  ca [--bundle]                 print Paygate's CA certificate (creating the CA if needed); with
                                --bundle, the system roots plus the CA, for REQUESTS_CA_BUNDLE,
                                SSL_CERT_FILE, CURL_CA_BUNDLE and the like
  copy-store [--to <url>]       copy the LevelDB state of dataDir (and the CA of certsDir) into an
                                empty PostgreSQL database for replicas (default: store.postgresUrl)
flags: every configuration key, e.g. --api-port 0 --chain-rpc-url http://… (see docs/configuration.md)`

/** A second SIGINT/SIGTERM this soon after the first is part of the same shutdown request; later, it forces the exit. */
const SAME_SIGNAL_MS = 1000

/** `paygate deploy-ledger`: uses the data directory's stored signer unless chain.signerKey is set. */
async function deployLedger(config: Config, withToken: boolean): Promise<void> {
  const store = await Store.open(config.dataDir)
  try {
    const { keystore, commit } = await Keystore.open(config.dataDir, config.masterKey, store.collection('meta'))
    const out = await deployExternal(config, { meta: store.collection('chain'), keystore }, { token: withToken })
    commit()
    process.stdout.write(`${JSON.stringify(out)}\n`)
  } finally {
    await store.close()
  }
}

/** The CA `paygate ca` prints: the files of certsDir, or on PostgreSQL the replicas' CA in the database. */
async function loadCaOf(config: Config): Promise<CertificateAuthority> {
  if (!config.store.postgresUrl) return CertificateAuthority.load(config.certsDir)
  if (!config.masterKey) throw new PaygateError('invalid_config', 'with store.postgresUrl, paygate ca needs masterKey (PAYGATE_MASTER_KEY), the same as the replicas')
  const store = await Store.open(config.dataDir, { postgresUrl: config.store.postgresUrl })
  try {
    const { keystore } = await store.withInitLock(() => Keystore.open(config.dataDir, config.masterKey, store.collection('meta')))
    return await CertificateAuthority.forStore(store, config.certsDir, keystore)
  } finally {
    await store.close()
  }
}

/** `paygate [start] [--flags]`: start the gateway and run until SIGINT/SIGTERM. */
async function main(): Promise<void> {
  const { config, positional } = loadConfig({ argv: process.argv.slice(2), env: process.env })
  for (const [text, shown] of secretTexts(config)) hideInLogs(text, shown)
  const command = positional[0] ?? 'start'
  if (command === 'deploy-ledger') {
    const extra = positional.slice(1).filter((a) => a !== '--with-token')
    if (extra.length) throw new PaygateError('invalid_config', `unknown argument ${extra[0]}\n${USAGE}`)
    return deployLedger(config, positional.includes('--with-token'))
  }
  if (command === 'copy-store') {
    const { copyStore } = await import('./copy-store.js')
    return copyStore(config, positional.slice(1), (line) => process.stdout.write(`${line}\n`))
  }
  if (command === 'ca') {
    const extra = positional.slice(1).filter((a) => a !== '--bundle')
    if (extra.length) throw new PaygateError('invalid_config', `unknown argument ${extra[0]}\n${USAGE}`)
    const ca = await loadCaOf(config)
    process.stdout.write(positional.includes('--bundle') ? ca.bundle() : ca.certPem)
    return
  }
  if (command === 'help' || command === '--help') {
    process.stdout.write(`${USAGE}\n`)
    return
  }
  if (command !== 'start' || positional.length > 1) {
    throw new PaygateError('invalid_config', `unknown command or argument ${JSON.stringify(positional.slice(command === 'start' ? 1 : 0)[0])}\n${USAGE}`)
  }
  const log = createLogger(config.log.level)
  const gw = await startGateway(config, { log })
  log.info(
    { api: gw.apiUrl, proxy: gw.proxyUrl, caFile: gw.ca.files.caCert, dataDir: config.dataDir, accountKeyFile: gw.accountKey.file, chainRpc: gw.chain.info.rpcUrl, network: gw.chain.info.network },
    'paygate started',
  )
  if (gw.accountKey.created) {
    log.info({ accountKeyFile: gw.accountKey.file }, 'created an account key (first start, or every stored one was revoked); it is in the account key file (mode 0600)')
    // The key itself goes only to a person at a terminal, never into a log file or pipe.
    if (process.stdout.isTTY) process.stdout.write(`\n  Account key (shown once here): ${gw.accountKey.apiKey}\n\n`)
  }

  let stoppedAt: number | null = null
  const stop = (signal: string): void => {
    if (stoppedAt !== null) {
      // Ctrl-C under `npm start` can reach the gateway twice some milliseconds apart: from the
      // terminal to the process group, and again from tsx, which relays a signal the gateway
      // has not acknowledged within 30 ms (a busy event loop). That is the same request.
      if (performance.now() - stoppedAt < SAME_SIGNAL_MS) return
      log.warn({ signal }, 'second signal: exiting now')
      process.exit(1)
    }
    stoppedAt = performance.now()
    log.info({ signal }, 'shutting down')
    gw.close().then(
      () => {
        log.info('stopped')
        process.exit(0)
      },
      (e: unknown) => {
        log.error({ err: e }, 'shutdown failed')
        process.exit(1)
      },
    )
  }
  process.on('SIGINT', () => stop('SIGINT'))
  process.on('SIGTERM', () => stop('SIGTERM'))
}

main().catch((e: unknown) => {
  // Start-up failures are reported as one clear message, never a stack trace.
  const msg = isPaygateError(e) ? e.detail : e instanceof Error ? e.message : String(e)
  process.stderr.write(`paygate: cannot start: ${scrubSecrets(msg)}\n`)
  process.exit(isPaygateError(e) && e.code === 'invalid_config' ? 2 : 1)
})
