import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import YAML from 'yaml'
import { loadConfig } from '../../src/config/load.js'
import { envName, KEYS } from '../../src/config/keys.js'
import { checkSharedStore } from '../../src/config/checks.js'
import { tempDir } from '../helpers/gateway.js'
import { START_NODE_ARGS } from '../../bench/lib.js'

/**
 * docker-compose.yml cannot be run here (no Docker daemon), so it is checked as data: the
 * services, that each replica's environment is a configuration the gateway accepts for
 * replicas on PostgreSQL, and that the ports match the Dockerfile's and the defaults.
 */
const root = new URL('../../', import.meta.url)
const compose = YAML.parse(readFileSync(new URL('docker-compose.yml', root), 'utf8'))
const dockerfile = readFileSync(new URL('Dockerfile', root), 'utf8')
const defaults = JSON.parse(readFileSync(new URL('config/default.json', root), 'utf8'))

type Service = {
  build?: string
  image?: string
  command?: string | string[]
  environment: Record<string, string>
  volumes?: string[]
  ports?: string[]
  depends_on?: Record<string, { condition: string }>
}
const services = compose.services as Record<string, Service>
const REPLICAS = ['replica-a', 'replica-b']

/** Compose's `${VAR:-default}` and `${VAR:?error}`, as if VAR were unset (required ones get `required`). */
function interpolate(v: string, required: Record<string, string>): string {
  return v.replace(/\$\{(\w+)(:[-?])([^}]*)\}/g, (_m, name: string, op: string, rest: string) => {
    if (op === ':-') return rest
    if (!(name in required)) throw new Error(`${name} is required by the compose file (${rest}) but the test gives no value`)
    return required[name]!
  })
}

t.test('the services: PostgreSQL, a chain, a one-shot deploy and two replicas of the repo image', async (t) => {
  t.same(Object.keys(services).sort(), ['chain', 'deploy', 'postgres', 'replica-a', 'replica-b'])
  t.match(services.postgres!.image, /^postgres:/)
  t.match(services.chain!.image, /^ghcr\.io\/foundry-rs\/foundry:/)
  t.match(String(services.chain!.command), /anvil --host 0\.0\.0\.0 --port 8545/)
  for (const name of ['deploy', ...REPLICAS]) t.equal(services[name]!.build, '.', `${name} is built from the repo's Dockerfile`)
  t.match(String(services.deploy!.command), /node dist\/main\.js deploy-ledger --with-token/)
  for (const name of REPLICAS) {
    const deps = services[name]!.depends_on!
    t.same(deps.postgres, { condition: 'service_healthy' }, `${name} waits for PostgreSQL`)
    t.same(deps.deploy, { condition: 'service_completed_successfully' }, `${name} waits for the deploy`)
  }
})

t.test("every replica's environment: the same shared settings, a configuration the gateway accepts on PostgreSQL", async (t) => {
  const [a, b] = REPLICAS.map((n) => services[n]!.environment)
  t.same(b, a, 'both replicas share one database URL, master key, chain and signer')
  const known = new Set([...KEYS.map((k) => envName(k.path)), 'PAYGATE_CONFIG'])
  for (const name of ['deploy', ...REPLICAS]) {
    for (const v of Object.keys(services[name]!.environment)) t.ok(known.has(v), `${name}: ${v} is a configuration key (src/config/keys.ts)`)
  }
  for (const v of ['PAYGATE_STORE_POSTGRES_URL', 'PAYGATE_MASTER_KEY', 'PAYGATE_CHAIN_RPC_URL', 'PAYGATE_CHAIN_CHAIN_ID']) t.ok(a![v], `sets ${v}`)
  t.match(a!.PAYGATE_MASTER_KEY, /^\$\{PAYGATE_MASTER_KEY:\?/, 'the master key must be given (compose refuses to start without it)')
  t.equal(new URL(interpolate(a!.PAYGATE_STORE_POSTGRES_URL!, {})).hostname, 'postgres', 'the database is the postgres service')
  t.equal(interpolate(a!.PAYGATE_CHAIN_RPC_URL!, {}), 'http://chain:8545', 'the chain is the chain service')
  t.equal(services.deploy!.environment.PAYGATE_CHAIN_SIGNER_KEY, a!.PAYGATE_CHAIN_SIGNER_KEY, 'the replicas record with the key that deployed the ledger')

  // chain.token and chain.ledger come from the file `deploy` writes into the volume the replicas mount.
  const deployVolume = services.deploy!.volumes!.find((v) => v.endsWith(':/data'))!.split(':')[0]
  const mount = services['replica-a']!.volumes!.find((v) => v.startsWith(`${deployVolume}:`))!.split(':')[1]!
  t.equal(a!.PAYGATE_CONFIG, `${mount}/chain.json`, 'the config file is in the deploy volume')
  t.match(String(services.deploy!.command), /writeFileSync\('\/data\/chain\.json', JSON\.stringify\(\{ chain: \{ token: d\.token, ledger: d\.ledger \} \}\)\)/, 'which deploy writes')

  // As the gateway would read it: with the file deploy writes, a configuration the replicas' start accepts.
  const dir = tempDir()
  const file = join(dir, 'chain.json')
  writeFileSync(file, JSON.stringify({ chain: { token: `0x${'11'.repeat(20)}`, ledger: `0x${'22'.repeat(20)}` } }))
  const env = Object.fromEntries(Object.entries(a!).map(([k, v]) => [k, interpolate(v, { PAYGATE_MASTER_KEY: 'ab'.repeat(32) })]))
  const { config } = loadConfig({ env: { ...env, PAYGATE_CONFIG: file } })
  t.doesNotThrow(() => checkSharedStore(config), 'masterKey and an external chain are set')
  t.ok(config.store.postgresUrl && config.chain.token && config.chain.ledger && config.chain.signerKey)
  t.equal(config.chain.chainId, 31337)
})

t.test("the replicas' container ports are the ones the Dockerfile exposes and the defaults", async (t) => {
  const exposed = (/^EXPOSE (.+)$/m.exec(dockerfile)?.[1] ?? '').split(/\s+/).map(Number).sort()
  t.same(exposed, [defaults.proxy.port, defaults.api.port].sort(), 'EXPOSE is the default proxy and API ports')
  const hostPorts: string[] = []
  for (const name of REPLICAS) {
    const ports = services[name]!.ports!.map((p) => p.split(':'))
    t.same(ports.map((p) => Number(p[1])).sort(), exposed, `${name} publishes the exposed ports`)
    hostPorts.push(...ports.map((p) => p[0]!))
  }
  t.equal(new Set(hostPorts).size, hostPorts.length, 'no host port published twice')
  t.match(dockerfile, /PAYGATE_API_HOST=0\.0\.0\.0/, 'the image listens beyond loopback')
})

t.test('the image and `npm start` run Node with the flags the benchmarks measure', async (t) => {
  const cmd = JSON.parse(/^CMD (\[.+\])$/m.exec(dockerfile)?.[1] ?? '[]') as string[]
  t.same(cmd, ['node', ...START_NODE_ARGS, 'dist/paygate.js'], 'the Dockerfile runs the built gateway (bundled) with them')
  const start = (JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as { scripts: Record<string, string> }).scripts.start
  t.equal(start, `exec node ${START_NODE_ARGS.join(' ')} dist/paygate.js`, 'npm start the same')
  t.ok(START_NODE_ARGS.length > 0)
})
