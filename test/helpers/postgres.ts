import { type SpawnSyncReturns, spawnSync } from 'node:child_process'
import { chmodSync, chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { freePort } from './ports.js'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import type { Test } from 'tap'

/**
 * A throwaway PostgreSQL cluster for tests: Debian's `postgresql` server (installed by
 * `.ci/run`), `initdb` in a temp dir owned by the `postgres` OS user (when we are root: the
 * server refuses to run as root), listening on a free loopback port only, with trust auth
 * (nothing but loopback reaches it, and it lives for one test process). Stopped with its own
 * `pg_ctl` when the test process ends.
 */
export interface PgCluster {
  port: number
  dir: string
  /** A connection URL for database `db`. */
  url(db?: string): string
  /** A new empty database; its URL. */
  createDatabase(prefix?: string): Promise<string>
  stop(): void
}

function binDir(): string {
  const root = '/usr/lib/postgresql'
  const versions = existsSync(root)
    ? readdirSync(root)
        .filter((v) => existsSync(join(root, v, 'bin', 'initdb')))
        .sort((a, b) => Number(b) - Number(a))
    : []
  if (!versions.length) throw new Error(`no PostgreSQL server under ${root}: install Debian's postgresql package (apt-get install postgresql; .ci/run does)`)
  return join(root, versions[0]!, 'bin')
}

const asRoot = process.getuid?.() === 0

/** Whether a cluster can be started here: the server binaries, and the postgres OS user when we are root. */
export function postgresAvailable(): boolean {
  try {
    binDir()
    if (asRoot) idOf('-u')
    return true
  } catch {
    return false
  }
}

function idOf(flag: '-u' | '-g'): number {
  const r = spawnSync('id', [flag, 'postgres'], { encoding: 'utf8' })
  if (r.status !== 0) throw new Error("no postgres OS user: install Debian's postgresql package")
  return Number(r.stdout.trim())
}

/** Run a server binary as the postgres user (as ourselves when not root). */
function run(bin: string, args: string[]): SpawnSyncReturns<string> {
  const cmd = asRoot ? 'runuser' : bin
  const argv = asRoot ? ['-u', 'postgres', '--', bin, ...args] : args
  return spawnSync(cmd, argv, { encoding: 'utf8', timeout: 120_000 })
}

function check(r: SpawnSyncReturns<string>, what: string): void {
  if (r.status !== 0) throw new Error(`${what} failed (${r.status ?? r.signal}): ${r.stderr || r.stdout}`)
}

let dbSeq = 0

/**
 * Start a new cluster; `stop()` it (or let the process exit do it). `settings`: more server
 * settings, `name=value` each (a bench loads `shared_preload_libraries=pg_stat_statements`).
 */
export async function startPostgres(extra: { settings?: string[] } = {}): Promise<PgCluster> {
  const bin = binDir()
  const dir = mkdtempSync(join(tmpdir(), 'paygate-pg-'))
  chmodSync(dir, 0o700)
  if (asRoot) chownSync(dir, idOf('-u'), idOf('-g'))
  const data = join(dir, 'data')
  check(run(join(bin, 'initdb'), ['-D', data, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--locale=C', '--no-sync', '--no-instructions']), 'initdb')
  let port = 0
  let stopped = false
  const stop = (): void => {
    if (stopped) return
    stopped = true
    process.removeListener('exit', stop)
    run(join(bin, 'pg_ctl'), ['-D', data, '-m', 'immediate', '-w', 'stop'])
    rmSync(dir, { recursive: true, force: true })
  }
  process.once('exit', stop)
  // A port found free may be taken before the server binds it: try another.
  for (let attempt = 0; ; attempt++) {
    port = await freePort()
    const opts = `-c listen_addresses=127.0.0.1 -p ${port} -c unix_socket_directories=${dir} -c fsync=off -c full_page_writes=off -c max_connections=300${(extra.settings ?? []).map((x) => ` -c ${x}`).join('')}`
    const r = run(join(bin, 'pg_ctl'), ['-D', data, '-l', join(dir, 'log'), '-w', '-t', '60', '-o', opts, 'start'])
    if (r.status === 0) break
    if (attempt === 2) {
      stop()
      check(r, 'pg_ctl start')
    }
  }
  const url = (db = 'postgres'): string => `postgres://postgres@127.0.0.1:${port}/${db}`
  return {
    port,
    dir,
    url,
    stop,
    async createDatabase(prefix = 'paygate_test') {
      const name = `${prefix}_${process.pid}_${++dbSeq}`
      const c = new pg.Client({ connectionString: url() })
      await c.connect()
      try {
        await c.query(`CREATE DATABASE ${pg.escapeIdentifier(name)}`)
      } finally {
        await c.end()
      }
      return url(name)
    },
  }
}

let shared: Promise<PgCluster> | undefined

/** One cluster for this test process, started on first use and stopped when the root test ends. */
export function sharedPostgres(): Promise<PgCluster> {
  if (!shared) {
    shared = startPostgres()
    // tap is loaded here only: benches import these helpers and must not become tap tests
    // (a root test with tap's 30 s timeout). The cluster also stops at process exit.
    void import('tap').then(({ default: tap }) => tap.teardown(async () => (await shared)?.stop()))
  }
  return shared
}

/** A fresh database in this process's cluster, for test `t`. */
export async function testDatabase(_t?: Test): Promise<string> {
  return (await sharedPostgres()).createDatabase()
}
