import t from 'tap'
import { spawnSync } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { createServer as createNetServer, type AddressInfo } from 'node:net'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { testDir } from '../helpers/gateway.js'
import { call, runCli, spawnGateway } from '../helpers/process.js'

t.test('a bad config value stops the start with a clear message and no stack', async (t) => {
  const dataDir = testDir(t)
  const r = await runCli({ PAYGATE_DATA_DIR: dataDir, PAYGATE_API_PORT: 'eighty' }, [])
  t.equal(r.code, 2)
  t.match(r.stderr, /api\.port = "eighty"/)
  t.match(r.stderr, /PAYGATE_API_PORT/)
  t.match(r.stderr, /integer port 0-65535/)
  t.notMatch(r.stderr, /\n\s+at /, 'no stack trace')
  const flag = await runCli({ PAYGATE_DATA_DIR: dataDir }, ['--log-level', 'chatty'])
  t.equal(flag.code, 2)
  t.match(flag.stderr, /log\.level = "chatty" \(from --log-level\)/)
})

/** Whether process `pid`'s command line holds `text` (false once it is gone). */
function cmdlineHas(pid: string, text: string): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(text)
  } catch {
    return false
  }
}

t.test('a port already in use stops the start with a message', async (t) => {
  const dataDir = testDir(t)
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => first.stop('SIGKILL'))
  const port = new URL(first.url).port
  const other = testDir(t)
  const r = await runCli({ PAYGATE_DATA_DIR: other, PAYGATE_API_PORT: port }, [])
  t.equal(r.code, 1)
  t.match(r.stderr, new RegExp(`cannot start: api\\.port = ${port}: 127\\.0\\.0\\.1:${port} is already in use \\(EADDRINUSE\\)`))

  // The embedded chain's port (18545 by default; a taken one names chain.rpcPort).
  const holder = createNetServer()
  await new Promise<void>((res) => holder.listen(0, '127.0.0.1', res))
  t.teardown(() => new Promise<void>((res) => holder.close(() => res())))
  const taken = (holder.address() as AddressInfo).port
  const third = testDir(t)
  const c = await runCli({ PAYGATE_DATA_DIR: third, PAYGATE_API_PORT: '0', PAYGATE_PROXY_PORT: '0', PAYGATE_CHAIN_RPC_PORT: String(taken) }, [])
  t.equal(c.code, 1)
  t.match(c.stderr, new RegExp(`chain\\.rpcPort = ${taken}: 127\\.0\\.0\\.1:${taken} is already in use`))
  const left = readdirSync('/proc').filter((p) => /^\d+$/.test(p) && cmdlineHas(p, third))
  t.same(left, [], 'no anvil left behind')
  // The failed start left no key file: the next start on that directory is a first start.
  t.notOk(existsSync(join(third, 'account-key')), 'no account key file from the failed start')
  t.notOk(existsSync(join(third, 'master-key')), 'no master key file from the failed start')
  const next = await spawnGateway({ PAYGATE_DATA_DIR: third })
  t.teardown(() => next.stop('SIGKILL'))
  t.ok(
    next.stdout.some((l) => l.includes('created an account key')),
    'the next start creates the account key as a first start does',
  )
  t.ok(existsSync(join(third, 'master-key')) && !existsSync(join(third, 'master-key.new')), 'the master key is committed by the start that succeeds')
  t.equal(await next.stop('SIGTERM'), 0)
})

t.test('a second start on a data directory in use names the pid that holds it', async (t) => {
  const dataDir = testDir(t)
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => first.stop('SIGKILL'))
  const r = await runCli({ PAYGATE_DATA_DIR: dataDir, PAYGATE_API_PORT: '0', PAYGATE_PROXY_PORT: '0', PAYGATE_CHAIN_RPC_PORT: '0' }, [])
  t.equal(r.code, 1)
  t.match(r.stderr, `cannot start: the data directory ${dataDir} is in use by another process (held by pid ${first.proc.pid}); stop that Paygate or choose another data directory`)
  t.notMatch(r.stderr, /Database failed to open/)
  t.equal(await first.stop('SIGTERM'), 0)
  const again = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => again.stop('SIGKILL'))
  t.equal(await again.stop('SIGTERM'), 0, 'free again once its holder stopped')
})

t.test('start prints where everything is; no secret ever reaches the logs', async (t) => {
  const dataDir = testDir(t)
  const envKey = `rp_live_${'E'.repeat(40)}`
  const masterKey = 'cd'.repeat(32)
  const gw = await spawnGateway({ PAYGATE_DATA_DIR: dataDir, PAYGATE_ACCOUNT_KEY: envKey, PAYGATE_MASTER_KEY: masterKey, PAYGATE_LOG_LEVEL: 'trace' })
  const started = gw.stdout.map((l) => JSON.parse(l)).find((j) => j.msg === 'paygate started')
  t.match(started, { api: /^http:\/\/127\.0\.0\.1:\d+$/, dataDir, accountKeyFile: join(dataDir, 'account-key') })
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()

  const secrets = [acct, envKey, masterKey]
  const a = await call(gw.url, 'POST', '/v1/agents', acct, { agentId: 'quiet' })
  secrets.push(a.body.apiKey)
  const k = await call(gw.url, 'POST', '/v1/agents/quiet/keys', envKey)
  secrets.push(k.body.apiKey)
  const ak = await call(gw.url, 'POST', '/v1/keys', acct)
  secrets.push(ak.body.apiKey)
  await call(gw.url, 'GET', '/v1/policies/quiet', a.body.apiKey)
  await call(gw.url, 'GET', '/v1/agents', `rp_live_${'W'.repeat(40)}`)
  await call(gw.url, 'DELETE', `/v1/keys/${k.body.keyId}`, acct)
  await call(gw.url, 'GET', '/v1/policies/quiet', k.body.apiKey)

  // After creation, no response shows a key again.
  const views = [
    await call(gw.url, 'GET', '/v1/agents', acct),
    await call(gw.url, 'GET', '/v1/agents/quiet', acct),
    await call(gw.url, 'GET', '/v1/agents/quiet/keys', acct),
    await call(gw.url, 'GET', '/v1/keys', acct),
    await call(gw.url, 'GET', '/v1/policies/quiet', acct),
  ]
  for (const v of views) for (const s of secrets) t.notOk(v.text.includes(s), 'no key in a later response')

  t.equal(await gw.stop('SIGTERM'), 0)
  const output = gw.stdout.join('\n') + gw.stderr.join('\n')
  t.ok(gw.stdout.filter((l) => JSON.parse(l).msg === 'api request').length >= 12, 'requests were logged')
  for (const s of secrets) t.notOk(output.includes(s), `secret ${s.slice(0, 10)}… absent from logs`)
  t.notMatch(output, /rp_(live|agent)_[0-9A-Za-z]{20,}/, 'nothing key-shaped in logs')
})

t.test('the sidecar default agent is refused on a non-loopback proxy bind unless forced', async (t) => {
  const dataDir = testDir(t)
  const r = await runCli({ PAYGATE_DATA_DIR: dataDir, PAYGATE_API_PORT: '0', PAYGATE_CHAIN_RPC_PORT: '0', PAYGATE_PROXY_HOST: '0.0.0.0', PAYGATE_PROXY_DEFAULT_AGENT: 'side' }, [])
  t.equal(r.code, 2)
  t.match(r.stderr, /proxy\.defaultAgent is allowed only when the proxy binds to loopback/)
})

t.test('the package bin (`paygate`) runs the same CLI: `paygate ca` prints the CA that `npm start -- ca` prints', async (t) => {
  const dataDir = testDir(t)
  const env = { PATH: process.env.PATH ?? '', PAYGATE_DATA_DIR: dataDir, PAYGATE_CERTS_DIR: join(dataDir, 'certs') }
  const bin = fileURLToPath(new URL('../../bin/paygate.js', import.meta.url))
  const viaBin = spawnSync(process.execPath, [bin, 'ca'], { env, encoding: 'utf8', timeout: 60_000 })
  t.equal(viaBin.status, 0, viaBin.stderr)
  t.match(viaBin.stdout, /^-----BEGIN CERTIFICATE-----\n/)
  const viaCli = await runCli({ PAYGATE_DATA_DIR: dataDir, PAYGATE_CERTS_DIR: join(dataDir, 'certs') }, ['ca'])
  t.equal(viaCli.code, 0)
  t.equal(viaBin.stdout, viaCli.stdout, 'the same CA, created once and reused')
  const bad = spawnSync(process.execPath, [bin, 'nope'], { env, encoding: 'utf8', timeout: 60_000 })
  t.equal(bad.status, 2)
  t.match(bad.stderr, /unknown command or argument "nope"/)
})

t.test('an upstream CA file with no certificate in it stops the start naming the key', async (t) => {
  const dataDir = testDir(t)
  const notPem = join(dataDir, 'not-a-ca.txt')
  writeFileSync(notPem, 'hostname\n')
  const broken = join(dataDir, 'broken.pem')
  writeFileSync(broken, '-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n')
  for (const [file, why] of [
    [notPem, /upstream\.caFile .*not-a-ca\.txt holds no PEM certificate/],
    [broken, /upstream\.caFile .*broken\.pem holds a certificate that cannot be read/],
  ] as const) {
    const r = await runCli({ PAYGATE_DATA_DIR: dataDir, PAYGATE_API_PORT: '0', PAYGATE_PROXY_PORT: '0', PAYGATE_CHAIN_RPC_PORT: '0', PAYGATE_UPSTREAM_CA_FILE: file }, [])
    t.not(r.code, 0, 'the start stops')
    t.match(r.stderr, why)
    t.notMatch(r.stderr, /\n\s+at /, 'no stack')
  }
})
