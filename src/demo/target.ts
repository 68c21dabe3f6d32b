/**
 * The gateway the demo talks to: the one answering on the configured API address (its
 * account key from PAYGATE_ACCOUNT_KEY or its data directory's key file), else one started
 * in this process in a temporary directory, removed on exit.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Config } from '../config/load.js'
import { PaygateError } from '../errors/index.js'
import { startGateway, type Gateway } from '../gateway.js'
import { createLogger } from '../log/index.js'

export interface DemoTarget {
  apiUrl: string
  proxyUrl: string
  accountKey: string
  /** How a shell command names the account key: the key file read with `cat`, or the environment variable. */
  accountKeyShell: string
  /** Where the demo keeps what it writes (the agent key file). */
  dataDir: string
  /** null: the demo talks to a gateway that was running already. */
  started: Gateway | null
  close(): Promise<void>
}

export interface ApiAnswer {
  status: number
  // biome-ignore lint/suspicious/noExplicitAny: the API's JSON answers, read field by field where they are used
  body: any
}

/** One JSON call to the API with the account key (or `key`). */
export async function api(t: Pick<DemoTarget, 'apiUrl' | 'accountKey'>, method: string, path: string, body?: unknown, key = t.accountKey): Promise<ApiAnswer> {
  const res = await fetch(t.apiUrl + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(60_000),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : undefined }
}

const hostOf = (h: string): string => (h === '0.0.0.0' ? '127.0.0.1' : h === '::' ? '[::1]' : h.includes(':') ? `[${h}]` : h)

/** The gateway on the configured API address, if one answers /healthz there. */
async function running(config: Config): Promise<DemoTarget | null> {
  if (config.api.port === 0) return null
  const apiUrl = `http://${hostOf(config.api.host)}:${config.api.port}`
  const alive = await fetch(`${apiUrl}/healthz`, { signal: AbortSignal.timeout(2000) }).then(
    (r) => r.ok,
    () => false,
  )
  if (!alive) return null
  const file = join(config.dataDir, 'account-key')
  const fromFile = existsSync(file) ? readFileSync(file, 'utf8').trim() : ''
  const accountKey = config.accountKey ?? fromFile
  if (!accountKey) {
    throw new PaygateError(
      'invalid_config',
      `a gateway answers at ${apiUrl}, but there is no account key: set PAYGATE_ACCOUNT_KEY, or run the demo with the data directory that gateway uses (${file} does not exist)`,
    )
  }
  const proxyUrl = `http://${hostOf(config.proxy.host)}:${config.proxy.port}`
  const accountKeyShell = config.accountKey ? '$PAYGATE_ACCOUNT_KEY' : `$(cat ${file})`
  return { apiUrl, proxyUrl, accountKey, accountKeyShell, dataDir: config.dataDir, started: null, close: async () => {} }
}

/** A gateway in a temporary directory, in this process; its chain on a free port (a running one may hold the default). */
async function startedInTemp(config: Config): Promise<DemoTarget> {
  const dataDir = mkdtempSync(join(tmpdir(), 'paygate-demo-'))
  const own: Config = { ...config, dataDir, certsDir: join(dataDir, 'certs'), chain: { ...config.chain, rpcPort: 0 } }
  let gw: Gateway
  try {
    gw = await startGateway(own, { log: createLogger('warn', process.stderr) })
  } catch (e) {
    rmSync(dataDir, { recursive: true, force: true })
    throw e
  }
  const file = gw.accountKey.file
  return {
    apiUrl: gw.apiUrl,
    proxyUrl: gw.proxyUrl,
    accountKey: readFileSync(file, 'utf8').trim(),
    accountKeyShell: `$(cat ${file})`,
    dataDir,
    started: gw,
    async close() {
      await gw.close()
      rmSync(dataDir, { recursive: true, force: true })
    },
  }
}

/** Refuse on an external chain: there is no faucet to fund the demo wallet and merchant. */
export function refuseExternal(chain: { embedded?: boolean; network: string }): void {
  if (chain.embedded !== true) {
    throw new PaygateError(
      'invalid_config',
      `the gateway's chain is external (${chain.network}); the demo runs only on the embedded dev chain, whose faucet funds the demo wallet and merchant. Start Paygate without chain.rpcUrl (PAYGATE_CHAIN_RPC_URL) to run it`,
    )
  }
}

export async function demoTarget(config: Config): Promise<DemoTarget> {
  return (await running(config)) ?? startedInTemp(config)
}
