import { existsSync } from 'node:fs'
import { join } from 'node:path'
import type { Config } from './config/load.js'
import { PaygateError } from './errors/index.js'
import { hideInLogs } from './log/index.js'
import { readCaFiles } from './proxy/ca-files.js'
import { CA_COLLECTION, CA_ENTRY, sealCa } from './proxy/ca-stored.js'
import { LevelStore } from './store/index.js'
import { systemClock } from './util/clock.js'
import { Keystore } from './wallet/keystore.js'

/**
 * `paygate copy-store [--to <postgresUrl>]`: copy the LevelDB state of `dataDir` into an
 * empty PostgreSQL database for replicas (docs/replicas.md), with the interception CA of
 * `certsDir` (into `ca/authority`, keys encrypted under the master key). The target is
 * `--to`, else `store.postgresUrl` (PAYGATE_STORE_POSTGRES_URL, which keeps a password out of
 * the process list). Secrets are copied encrypted as stored, so the replicas need the master
 * key this data directory used.
 */
export function copyTarget(config: Config, args: readonly string[]): string {
  let to: string | undefined
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!
    if (a === '--to') {
      to = args[++i]
      if (to === undefined) throw new PaygateError('invalid_config', 'flag --to needs a value (a postgres:// URL)')
    } else if (a.startsWith('--to=')) to = a.slice('--to='.length)
    else throw new PaygateError('invalid_config', `unknown argument ${a}`)
  }
  to ??= config.store.postgresUrl ?? undefined
  if (!to) throw new PaygateError('invalid_config', 'copy-store needs the target database: --to <postgres://...> or store.postgresUrl (PAYGATE_STORE_POSTGRES_URL)')
  if (!/^postgres(ql)?:\/\//.test(to)) throw new PaygateError('invalid_config', '--to must be a postgres:// or postgresql:// URL')
  try {
    const password = decodeURIComponent(new URL(to).password)
    if (password) hideInLogs(password)
  } catch {
    // the driver reports a URL it cannot read
  }
  return to
}

/** The master key this data directory's secrets are encrypted with, and where it comes from (for the notes). */
function masterKeySource(config: Config): string {
  if (config.masterKey) return 'masterKey (PAYGATE_MASTER_KEY) as given to this command'
  const file = join(config.dataDir, 'master-key')
  if (existsSync(file)) return `the key in ${file} (64 hex characters)`
  throw new PaygateError('invalid_config', `${config.dataDir} has no master-key file: set PAYGATE_MASTER_KEY to the master key this data directory was run with`)
}

export async function copyStore(config: Config, args: readonly string[], print: (line: string) => void): Promise<void> {
  const url = copyTarget(config, args)
  if (!existsSync(join(config.dataDir, 'state'))) throw new PaygateError('invalid_config', `${config.dataDir} holds no LevelDB state (no state/ directory): nothing to copy`)
  const keySource = masterKeySource(config)
  // Refused while a gateway holds the data directory (naming its pid); opening replays the write-ahead log.
  const source = await LevelStore.open(config.dataDir)
  try {
    // Checks the master key against what the data directory holds, before anything is copied.
    const { keystore } = await Keystore.open(config.dataDir, config.masterKey, source.collection('meta'))
    const now = systemClock.now()
    const ca = await readCaFiles(config.certsDir, () => systemClock.now(), undefined)
    const extra = ca ? [{ coll: CA_COLLECTION, key: CA_ENTRY, value: JSON.stringify(sealCa(ca, keystore, now)) }] : []
    const { copyLevelToPostgres } = await import('./store/copy.js')
    const report = await copyLevelToPostgres(source, url, { extra })
    print(`copied ${report.total} entries from ${config.dataDir} into PostgreSQL, verified (entries per collection):`)
    const width = Math.max(0, ...report.collections.map((c) => c.name.length))
    for (const c of report.collections) print(`  ${c.name.padEnd(width)}  ${c.entries}`)
    print(
      ca
        ? `the interception CA of ${config.certsDir} is in the database (${CA_COLLECTION}/${CA_ENTRY}): agents that trust it keep working on every replica`
        : `no interception CA in ${config.certsDir}: the first replica creates one in the database`,
    )
    print(`every replica must run with PAYGATE_MASTER_KEY set to the master key of this data directory: ${keySource}`)
    print('wallet keys, the signer key and the CA keys were copied encrypted under it; account and agent keys are stored hashed: the ones issued keep working')
    print('replicas need an external chain (chain.rpcUrl, chain.token, chain.ledger); records made on another chain (the embedded one) are copied as history')
  } finally {
    await source.close()
  }
}
