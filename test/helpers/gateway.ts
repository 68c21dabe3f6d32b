import type { Test } from 'tap'
import { mkdtempSync, rmSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Writable } from 'node:stream'
import { createPublicClient, http, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { loadConfig, type Config } from '../../src/config/load.js'
import { startGateway, type Gateway, type GatewayOptions } from '../../src/gateway.js'
import { createLogger } from '../../src/log/index.js'
import { Store } from '../../src/store/index.js'
import type { Clock } from '../../src/util/clock.js'
import type { MerchantOptions } from './merchants.js'
import { testDatabase } from './postgres.js'

export interface ApiResult {
  status: number
  headers: Headers
  body: any
  text: string
}

export interface TestGateway {
  gw: Gateway
  url: string
  dataDir: string
  accountKey: string
  /** Every log line written so far. */
  logs: string[]
  api(method: string, path: string, opts?: { key?: string | null; body?: unknown; rawBody?: string; headers?: Record<string, string> }): Promise<ApiResult>
  close(opts?: { keepData?: boolean }): Promise<void>
}

const madeDirs: string[] = []
// Every temp dir goes when the test process ends, also where a test fails before its own cleanup.
process.once('exit', () => {
  for (const d of madeDirs) {
    try {
      rmSync(d, { recursive: true, force: true })
    } catch {
      // a child still writing there (after a failed test): left behind rather than change the exit code
    }
  }
})
export const tempDir = (prefix = 'paygate-test-'): string => {
  const d = mkdtempSync(join(tmpdir(), prefix))
  madeDirs.push(d)
  return d
}

/** The store backends that store tests run against (same assertions on each). */
export const STORE_BACKENDS = ['level', 'postgres'] as const
export type StoreBackend = (typeof STORE_BACKENDS)[number]

/**
 * A Store in a fresh temp dir (LevelDB and its log), or on `postgres` in a fresh database of
 * this test process's throwaway cluster (`helpers/postgres.ts`); closed, and the dir removed,
 * when test `t` ends. `url`: the database's, to open it again.
 */
export async function testStore(t: Test, prefix?: string, backend: StoreBackend = 'level'): Promise<{ store: Store; dir: string; url?: string }> {
  const dir = tempDir(prefix)
  const url = backend === 'postgres' ? await testDatabase() : undefined
  const store = await Store.open(dir, url ? { postgresUrl: url } : {})
  t.teardown(async () => {
    await store.close()
    rmSync(dir, { recursive: true, force: true })
  })
  return { store, dir, ...(url ? { url } : {}) }
}

/** A temp dir removed when test `t` ends (and, as every temp dir, at exit at the latest). */
export function testDir(t: Test, prefix?: string): string {
  const d = tempDir(prefix)
  t.teardown(() => rmSync(d, { recursive: true, force: true }))
  return d
}

/** Start a real gateway in this process on port 0 with a fresh LevelDB in a temp dir. */
export async function startTestGateway(
  opts: { dataDir?: string; env?: Record<string, string>; clock?: Clock; overrides?: (c: Config) => void; options?: Omit<GatewayOptions, 'log' | 'clock'> } = {},
): Promise<TestGateway> {
  const dataDir = opts.dataDir ?? tempDir()
  const { config } = loadConfig({
    env: { PAYGATE_DATA_DIR: dataDir, PAYGATE_API_PORT: '0', PAYGATE_PROXY_PORT: '0', PAYGATE_CHAIN_RPC_PORT: '0', PAYGATE_CERTS_DIR: join(dataDir, 'certs'), PAYGATE_LOG_LEVEL: 'info', ...opts.env },
  })
  opts.overrides?.(config)
  const logs: string[] = []
  const sink = new Writable({
    write(chunk, _enc, cb) {
      logs.push(...String(chunk).split('\n').filter(Boolean))
      cb()
    },
  })
  const gw = await startGateway(config, { log: createLogger('info', sink), ...(opts.clock ? { clock: opts.clock } : {}), ...opts.options })
  const accountKey = readFileSync(gw.accountKey.file, 'utf8').trim()
  const url = gw.apiUrl
  return {
    gw,
    url,
    dataDir,
    accountKey,
    logs,
    async api(method, path, o = {}) {
      const headers: Record<string, string> = { ...o.headers }
      const key = o.key === undefined ? accountKey : o.key
      if (key !== null) headers.authorization = `Bearer ${key}`
      let body: string | undefined = o.rawBody
      if (o.body !== undefined) {
        body = JSON.stringify(o.body)
        headers['content-type'] ??= 'application/json'
      }
      const res = await fetch(url + path, { method, headers, ...(body !== undefined ? { body } : {}) })
      const text = await res.text()
      let parsed: unknown
      try {
        parsed = text ? JSON.parse(text) : undefined
      } catch {
        parsed = undefined
      }
      return { status: res.status, headers: res.headers, body: parsed, text }
    },
    async close(o = {}) {
      await gw.close()
      if (!o.keepData && !opts.dataDir) rmSync(dataDir, { recursive: true, force: true })
    },
  }
}

/**
 * The gateway's chain as the payment tests use it: `GET /v1/chain`, a public client on its
 * RPC, token balances, fresh keys funded with gas (a facilitator settles with one), and the
 * options of a test merchant on it.
 */
export async function testChain(gw: TestGateway) {
  const info = (await gw.api('GET', '/v1/chain')).body
  const pub = createPublicClient({ chain: viemChain(info.chainId, info.network, info.rpcUrl), transport: http(info.rpcUrl), pollingInterval: 20 })
  const fundedKey = async (): Promise<Hex> => {
    const key = generatePrivateKey()
    await pub.request({ method: 'anvil_setBalance' as never, params: [privateKeyToAccount(key).address, '0x56bc75e2d63100000'] as never })
    return key
  }
  return {
    info,
    pub,
    balanceOf: (a: Hex): Promise<bigint> => pub.readContract({ address: info.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [a] }),
    fundedKey,
    /** Options for an x402 test merchant on this chain at `price`: a fresh facilitator funded with gas, paying a fresh address. */
    async merchantOptions(price: bigint): Promise<MerchantOptions> {
      return { chain: { rpcUrl: info.rpcUrl, chainId: info.chainId, token: info.token }, facilitatorKey: await fundedKey(), payTo: privateKeyToAccount(generatePrivateKey()).address, price }
    },
  }
}
