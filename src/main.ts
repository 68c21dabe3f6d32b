import { loadConfig } from './config/load.js'
import { isPaygateError } from './errors/index.js'
import { startGateway } from './gateway.js'
import { createLogger } from './log/index.js'

/** `paygate [start] [--flags]`: start the gateway and run until SIGINT/SIGTERM. */
async function main(): Promise<void> {
  const { config, positional } = loadConfig({ argv: process.argv.slice(2), env: process.env })
  const command = positional[0] ?? 'start'
  if (command !== 'start') {
    process.stderr.write(`paygate: unknown command ${JSON.stringify(command)} (commands: start)\n`)
    process.exit(2)
  }
  const log = createLogger(config.log.level)
  const gw = await startGateway(config, { log })
  log.info({ api: gw.apiUrl, dataDir: config.dataDir, accountKeyFile: gw.accountKey.file }, 'paygate started')
  if (gw.accountKey.created) {
    log.info({ accountKeyFile: gw.accountKey.file }, 'created the account key on first start; it is in the account key file (mode 0600)')
    // The key itself goes only to a person at a terminal, never into a log file or pipe.
    if (process.stdout.isTTY) process.stdout.write(`\n  Account key (shown once here): ${gw.accountKey.apiKey}\n\n`)
  }

  let stopping = false
  const stop = (signal: string): void => {
    if (stopping) {
      log.warn({ signal }, 'second signal: exiting now')
      process.exit(1)
    }
    stopping = true
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
  process.stderr.write(`paygate: cannot start: ${msg}\n`)
  process.exit(isPaygateError(e) && e.code === 'invalid_config' ? 2 : 1)
})
