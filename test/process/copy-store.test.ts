import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { createServer as createHttpsServer } from 'node:https'
import { connect, type Socket } from 'node:net'
import { join } from 'node:path'
import { X509Certificate } from 'node:crypto'
import { connect as tlsConnect } from 'node:tls'
import pg from 'pg'
import t, { type Test } from 'tap'
import { createPublicClient, createWalletClient, http, type Address } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { CertificateAuthority } from '../../src/proxy/ca.js'
import { LevelStore } from '../../src/store/index.js'
import { PostgresStore } from '../../src/store/postgres.js'
import { startAnvil } from '../helpers/anvil.js'
import { tempDir, testDir } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { testDatabase } from '../helpers/postgres.js'
import { call, type GatewayProcess, runCli, spawnGateway } from '../helpers/process.js'

// Gateways, a chain and a copy on a 2-core machine shared with other tests.
t.setTimeout(600_000)

const CHAIN_ID = 31339
const START_MS = 90_000

const anvil = await startAnvil(CHAIN_ID)
t.teardown(() => anvil.stop())
const signerKey = generatePrivateKey()
await anvil.request('anvil_setBalance', [privateKeyToAccount(signerKey).address, '0x56bc75e2d63100000'])
const chainEnv = { PAYGATE_CHAIN_RPC_URL: anvil.url, PAYGATE_CHAIN_CHAIN_ID: String(CHAIN_ID), PAYGATE_CHAIN_SIGNER_KEY: signerKey }
const dep = await runCli({ PAYGATE_DATA_DIR: tempDir(), ...chainEnv }, ['deploy-ledger', '--with-token'], START_MS)
if (dep.code !== 0) throw new Error(`deploy-ledger failed: ${dep.stderr}`)
const addrs = JSON.parse(dep.stdout) as { token: Address; ledger: Address }
const chain = { ...chainEnv, PAYGATE_CHAIN_TOKEN: addrs.token, PAYGATE_CHAIN_LEDGER: addrs.ledger }

// An HTTPS target on loopback with its own CA, which the gateways trust upstream.
const targetCa = await CertificateAuthority.load(join(tempDir(), 'target-ca'))
const targetCaFile = join(tempDir(), 'target-ca.pem')
writeFileSync(targetCaFile, targetCa.certPem)
const targetLeaf = targetCa.leafFor('127.0.0.1')
const targetPort = await listenForTest(
  t,
  createHttpsServer({ cert: targetLeaf.cert, key: targetLeaf.key }, (_req, res) => res.end('hello over tls')),
)
const upstreamEnv = { PAYGATE_UPSTREAM_CA_FILE: targetCaFile }

const PRICE = 1000n
const evm = viemChain(CHAIN_ID, 'ext', anvil.url)
const pub = createPublicClient({ chain: evm, transport: http(anvil.url) })
const minter = createWalletClient({ chain: evm, transport: http(anvil.url), account: privateKeyToAccount(signerKey) })

async function newMerchant(t: Test) {
  const facilitatorKey = generatePrivateKey()
  await anvil.request('anvil_setBalance', [privateKeyToAccount(facilitatorKey).address, '0x56bc75e2d63100000'])
  const payTo = privateKeyToAccount(generatePrivateKey()).address
  const m = await startV2Merchant({ chain: { rpcUrl: anvil.url, chainId: CHAIN_ID, token: addrs.token }, facilitatorKey, payTo, price: PRICE })
  t.teardown(() => m.close())
  return m
}

/** The proxy address a spawned gateway printed in its start line. */
function proxyOf(g: GatewayProcess): { host: string; port: number } {
  const line = g.stdout.map((l) => (l.startsWith('{') ? JSON.parse(l) : {})).find((j) => j.msg === 'paygate started')
  const u = new URL(line.proxy)
  return { host: u.hostname, port: Number(u.port) }
}

/** GET https://127.0.0.1:<targetPort>/ through `g`'s proxy (CONNECT, then TLS trusting only `caPem`): the body and the leaf the proxy served. */
async function throughProxy(t: Test, g: GatewayProcess, auth: string, caPem: string): Promise<{ body: string; leaf: X509Certificate }> {
  const { host, port } = proxyOf(g)
  const s: Socket = connect(port, host)
  t.teardown(() => s.destroy())
  await new Promise<void>((resolve, reject) => {
    s.once('error', reject)
    s.once('connect', () => resolve())
  })
  s.write(`CONNECT 127.0.0.1:${targetPort} HTTP/1.1\r\nHost: 127.0.0.1:${targetPort}\r\nProxy-Authorization: ${auth}\r\n\r\n`)
  const head = await new Promise<string>((resolve, reject) => {
    let buf = ''
    const onData = (d: Buffer): void => {
      buf += d.toString('latin1')
      if (buf.includes('\r\n\r\n')) {
        s.off('data', onData)
        resolve(buf)
      }
    }
    s.on('data', onData)
    s.once('error', reject)
  })
  if (!/^HTTP\/1\.1 200/.test(head)) throw new Error(`CONNECT answered ${head}`)
  const tls = tlsConnect({ socket: s, ca: caPem, host: '127.0.0.1' })
  t.teardown(() => tls.destroy())
  await new Promise<void>((resolve, reject) => {
    tls.once('secureConnect', () => resolve())
    tls.once('error', reject)
  })
  const leaf = tls.getPeerX509Certificate()!
  tls.write(`GET / HTTP/1.1\r\nHost: 127.0.0.1:${targetPort}\r\nConnection: close\r\n\r\n`)
  const answer = await new Promise<string>((resolve) => {
    let buf = ''
    tls.on('data', (d: Buffer) => (buf += d.toString()))
    tls.on('end', () => resolve(buf))
    tls.on('close', () => resolve(buf))
  })
  return { body: answer.slice(answer.indexOf('\r\n\r\n') + 4), leaf }
}

/** `GET /v1/ca.pem` (public, PEM text). */
const caPem = async (url: string): Promise<string> => (await fetch(`${url}/v1/ca.pem`)).text()

const basicOf = (agentId: string, key: string): string => `Basic ${Buffer.from(`${agentId}:${key}`).toString('base64')}`

/** Every collection of a LevelDB store and a PostgreSQL store, entry for entry, through the Store API. */
async function compareStores(t: Test, level: LevelStore, postgres: PostgresStore): Promise<string[]> {
  const names = new Set<string>()
  for await (const [coll] of level.dump()) names.add(coll)
  for (const name of names) {
    const a: [string, unknown][] = []
    const b: [string, unknown][] = []
    for await (const e of level.collection(name).entries()) a.push(e)
    for await (const e of postgres.collection(name).entries()) b.push(e)
    t.same(b, a, `collection ${name}: ${a.length} entries, the same in PostgreSQL`)
  }
  return [...names]
}

t.test('copy-store: a LevelDB gateway into PostgreSQL, then replicas on it', async (t) => {
  const srcDir = testDir(t)
  const srcEnv = { PAYGATE_DATA_DIR: srcDir, ...chain, ...upstreamEnv }
  // No PAYGATE_MASTER_KEY: the gateway makes <dataDir>/master-key, which the replicas must then use.
  const src = await spawnGateway(srcEnv, [], [], true, START_MS)
  t.teardown(() => src.stop('SIGKILL'))
  const acct = readFileSync(join(srcDir, 'account-key'), 'utf8').trim()

  const agent = await call(src.url, 'POST', '/v1/agents', acct, { agentId: 'copied' })
  t.equal(agent.status, 201, agent.text)
  const wallet = await call(src.url, 'POST', '/v1/wallets', acct, { agentId: 'copied' })
  t.equal(wallet.status, 201, wallet.text)
  await pub.waitForTransactionReceipt({ hash: await minter.writeContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'mint', args: [wallet.body.address, 1_000_000n] }) })
  t.equal((await call(src.url, 'PUT', '/v1/policies/copied', acct, { dailyBudget: { usdc: 0.01 } })).status, 200)
  const m = await newMerchant(t)
  const paid = await call(src.url, 'POST', '/v1/pay', acct, { agentId: 'copied', endpoint: `${m.url}/paid` })
  t.equal(paid.status, 200, paid.text)
  const srcTx = (await call(src.url, 'GET', '/v1/transactions?agentId=copied', acct)).body.transactions
  t.ok(srcTx.length >= 1, 'the source holds the paid transaction')
  const srcPolicy = (await call(src.url, 'GET', '/v1/policies/copied', acct)).body
  t.equal(srcPolicy.dailyBudget.usedToday, 0.001)
  const srcCa = readFileSync(join(srcDir, 'certs', 'ca.pem'), 'utf8')
  t.equal(await caPem(src.url), srcCa)

  const url = await testDatabase()
  const busy = await runCli(srcEnv, ['copy-store', '--to', url], START_MS)
  t.equal(busy.code, 1, 'refused while a gateway holds the data directory')
  t.match(busy.stderr, new RegExp(`in use by another process \\(held by pid ${src.proc.pid}\\)`), 'naming its pid')
  t.equal(await src.stop('SIGTERM'), 0)

  const noKey = await runCli({ ...srcEnv, PAYGATE_MASTER_KEY: 'ab'.repeat(32) }, ['copy-store', '--to', url], START_MS)
  t.equal(noKey.code, 2, 'a master key that cannot decrypt the data directory is refused before copying')
  t.match(noKey.stderr, /cannot decrypt the wallet keys/)

  const copied = await runCli(srcEnv, ['copy-store', '--to', url], START_MS)
  t.equal(copied.code, 0, copied.stderr)
  t.match(copied.stdout, /^copied \d+ entries from .* into PostgreSQL, verified/)
  for (const coll of ['agents', 'wallets', 'policies', 'usage', 'tx', 'keys', 'meta', 'ca']) t.match(copied.stdout, new RegExp(`\\n  ${coll} +\\d+\\n`), `counts ${coll}`)
  t.match(copied.stdout, /the interception CA of .* is in the database \(ca\/authority\)/)
  t.match(copied.stdout, new RegExp(`PAYGATE_MASTER_KEY set to the master key of this data directory: the key in ${join(srcDir, 'master-key')}`))

  const again = await runCli(srcEnv, ['copy-store', '--to', url], START_MS)
  t.equal(again.code, 2, 'a database that holds Paygate state is refused')
  t.match(again.stderr, /already holds Paygate state \(.*agents: 1, .*drop and recreate it/)

  const level = await LevelStore.open(srcDir)
  const postgres = await PostgresStore.open(url)
  try {
    const names = await compareStores(t, level, postgres)
    t.ok(names.length >= 10, `${names.length} collections compared`)
    // The raw text too: byte for byte, every row, nothing more than the source and the CA.
    const raw: string[] = []
    for await (const [coll, key, value] of level.dump()) raw.push(JSON.stringify([coll, key, value]))
    const c = new pg.Client({ connectionString: url })
    await c.connect()
    const rows = (await c.query<{ coll: string; key: Buffer; value: string }>("SELECT coll, key, value FROM paygate_state WHERE coll <> 'ca' ORDER BY coll, key")).rows
    await c.end()
    t.same(
      rows.map((r) => JSON.stringify([r.coll, r.key.toString('utf8'), r.value])),
      raw,
      `all ${raw.length} rows hold the JSON text LevelDB held`,
    )
    const stored = await postgres.collection<{ certPem: string; caKey: string }>('ca').get('authority')
    t.equal(stored?.certPem, srcCa, 'the CA certificate is in the database')
    t.notOk(stored?.caKey.includes('PRIVATE KEY'), 'its key encrypted')
  } finally {
    await level.close()
    await postgres.close()
  }

  // Two replicas on the copy, with the source's master key.
  const masterKey = readFileSync(join(srcDir, 'master-key'), 'utf8').trim()
  const shared = { ...chain, ...upstreamEnv, PAYGATE_STORE_POSTGRES_URL: url, PAYGATE_MASTER_KEY: masterKey }
  const replicas = await Promise.all([testDir(t), testDir(t)].map((d) => spawnGateway({ PAYGATE_DATA_DIR: d, ...shared }, [], [], true, START_MS)))
  t.teardown(() => Promise.all(replicas.map((g) => g.stop('SIGKILL'))))
  for (const [i, g] of replicas.entries()) {
    t.equal((await call(g.url, 'GET', '/v1/agents/copied', acct)).status, 200, `replica ${i}: the agent, with the source's account key`)
    t.equal((await call(g.url, 'GET', '/v1/wallets/copied', acct)).body.address, wallet.body.address, `replica ${i}: the wallet`)
    t.same((await call(g.url, 'GET', '/v1/policies/copied', acct)).body, srcPolicy, `replica ${i}: the policy and its usage`)
    t.same((await call(g.url, 'GET', '/v1/transactions?agentId=copied', acct)).body.transactions, srcTx, `replica ${i}: the transactions`)
    t.equal(await caPem(g.url), srcCa, `replica ${i}: serves the copied CA`)
  }
  const more = await call(replicas[1]!.url, 'POST', '/v1/pay', acct, { agentId: 'copied', endpoint: `${m.url}/paid` })
  t.equal(more.status, 200, `the copied wallet key decrypts and pays: ${more.text}`)
  t.equal((await call(replicas[0]!.url, 'GET', '/v1/policies/copied', acct)).body.dailyBudget.usedToday, 0.002, 'on the copied usage')

  // The agent key issued by the source gateway (stored hashed, copied) works on the replicas' proxies.
  const key = agent.body.apiKey as string
  for (const [i, g] of replicas.entries()) {
    const r = await throughProxy(t, g, basicOf('copied', key), srcCa)
    t.equal(r.body, 'hello over tls', `replica ${i}: an HTTPS target through the proxy, trusting the one CA`)
    t.ok(r.leaf.checkIssued(new X509Certificate(srcCa)), `replica ${i}: its leaf is issued by the copied CA`)
  }
})

t.test('replicas on a new database create one CA in it, and every replica serves it', async (t) => {
  const url = await testDatabase()
  const masterKey = 'ef'.repeat(32)
  const shared = { ...chain, ...upstreamEnv, PAYGATE_STORE_POSTGRES_URL: url, PAYGATE_MASTER_KEY: masterKey }
  const dirs = [testDir(t), testDir(t)]
  // Started together: the CA is made once, under the init lock.
  const replicas = await Promise.all(dirs.map((d) => spawnGateway({ PAYGATE_DATA_DIR: d, ...shared }, [], [], true, START_MS)))
  t.teardown(() => Promise.all(replicas.map((g) => g.stop('SIGKILL'))))
  const pems = await Promise.all(replicas.map(async (g) => await caPem(g.url)))
  t.match(pems[0], /^-----BEGIN CERTIFICATE-----/)
  t.equal(pems[1], pems[0], 'both replicas serve the same CA')
  for (const d of dirs) t.notOk(existsSync(join(d, 'certs', 'ca.key')) || existsSync(join(d, 'certs', 'ca.pem')), 'no CA files in certsDir on PostgreSQL')
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  const n = (await c.query("SELECT count(*)::int AS n FROM paygate_state WHERE coll = 'ca'")).rows[0].n
  await c.end()
  t.equal(n, 1, 'one CA entry in the database')

  const printed = await runCli({ PAYGATE_DATA_DIR: dirs[0]!, ...shared }, ['ca'], START_MS)
  t.equal(printed.code, 0, printed.stderr)
  t.equal(printed.stdout, pems[0], '`paygate ca` prints the database CA on PostgreSQL')

  const acct = readFileSync(join(dirs.find((d) => existsSync(join(d, 'account-key')))!, 'account-key'), 'utf8').trim()
  const agent = await call(replicas[0]!.url, 'POST', '/v1/agents', acct, { agentId: 'tls' })
  t.equal(agent.status, 201, agent.text)
  for (const [i, g] of replicas.entries()) {
    const r = await throughProxy(t, g, basicOf('tls', agent.body.apiKey), pems[0]!)
    t.equal(r.body, 'hello over tls', `replica ${i}: an HTTPS target through the proxy, trusting the one CA`)
    t.ok(r.leaf.checkIssued(new X509Certificate(pems[0]!)), `replica ${i}: its leaf is issued by it`)
  }
})
