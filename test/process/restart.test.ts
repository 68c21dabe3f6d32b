import t from 'tap'
import { readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { randomBase62 } from '../../src/util/random.js'
import { testDir } from '../helpers/gateway.js'
import { call, spawnGateway } from '../helpers/process.js'

t.test('agents, keys and policies survive SIGTERM and restart; revoked stays revoked', async (t) => {
  const dataDir = testDir(t)
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  const keyFile = join(dataDir, 'account-key')
  t.equal(statSync(keyFile).mode & 0o777, 0o600, 'account key file is 0600')
  const acct = readFileSync(keyFile, 'utf8').trim()

  const a = (await call(first.url, 'POST', '/v1/agents', acct, { agentId: 'survivor' })).body
  const k2 = (await call(first.url, 'POST', '/v1/agents/survivor/keys', acct)).body
  const k3 = (await call(first.url, 'POST', '/v1/agents/survivor/keys', acct)).body
  t.equal((await call(first.url, 'DELETE', `/v1/keys/${k3.keyId}`, acct)).status, 200)
  const policy = (await call(first.url, 'PUT', '/v1/policies/survivor', acct, { dailyBudget: { usdc: 3.5 }, blockedDomains: ['bad.example.com'] })).body

  t.equal(await first.stop('SIGTERM'), 0, 'clean exit on SIGTERM')
  t.ok(first.stdout.some((l) => JSON.parse(l).msg === 'stopped'))

  const second = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => second.stop('SIGKILL'))
  t.equal(readFileSync(keyFile, 'utf8').trim(), acct, 'the account key is kept, not recreated')
  t.equal((await call(second.url, 'GET', '/v1/agents/survivor', acct)).body.createdAt, a.createdAt)
  t.equal((await call(second.url, 'GET', '/v1/policies/survivor', a.apiKey)).status, 200, 'first agent key still works')
  t.equal((await call(second.url, 'GET', '/v1/policies/survivor', k2.apiKey)).status, 200, 'issued key still works')
  t.equal((await call(second.url, 'GET', '/v1/policies/survivor', k3.apiKey)).status, 401, 'revoked key stays revoked')
  t.same((await call(second.url, 'GET', '/v1/policies/survivor', acct)).body, policy, 'policy as it was')
  const keys = (await call(second.url, 'GET', '/v1/agents/survivor/keys', acct)).body.keys
  t.equal(keys.length, 3)
  t.equal(keys.filter((k: { revokedAt?: string }) => k.revokedAt).length, 1)
  t.equal(await second.stop('SIGINT'), 0, 'clean exit on SIGINT')
})

t.test('acknowledged changes survive SIGKILL', async (t) => {
  const dataDir = testDir(t)
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  const acct = readFileSync(join(dataDir, 'account-key'), 'utf8').trim()
  for (let i = 0; i < 20; i++) t.equal((await call(first.url, 'POST', '/v1/agents', acct, { agentId: `k${i}` })).status, 201)
  await call(first.url, 'PUT', '/v1/policies/k19', acct, { perCallLimit: { usdc: 0.01 } })
  t.equal(await first.stop('SIGKILL'), 'SIGKILL')
  const second = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => second.stop('SIGKILL'))
  t.equal((await call(second.url, 'GET', '/v1/agents?limit=100', acct)).body.agents.length, 20)
  t.equal((await call(second.url, 'GET', '/v1/policies/k19', acct)).body.perCallLimit.usdc, 0.01)
})

t.test('a revoked bootstrap key stays revoked after a restart: a new account key replaces it in the file', async (t) => {
  const dataDir = testDir(t)
  const keyFile = join(dataDir, 'account-key')
  const envKey = `rp_live_${randomBase62(40)}`
  const first = await spawnGateway({ PAYGATE_DATA_DIR: dataDir, PAYGATE_ACCOUNT_KEY: envKey })
  t.teardown(() => first.stop('SIGKILL'))
  const oldKey = readFileSync(keyFile, 'utf8').trim()
  const [bootstrap] = (await call(first.url, 'GET', '/v1/keys', envKey)).body.keys
  // With PAYGATE_ACCOUNT_KEY set, the last stored account key may be revoked.
  t.equal((await call(first.url, 'DELETE', `/v1/keys/${bootstrap.keyId}`, envKey)).status, 200)
  t.equal((await call(first.url, 'GET', '/v1/agents', oldKey)).status, 401)
  t.equal(await first.stop('SIGTERM'), 0)

  const second = await spawnGateway({ PAYGATE_DATA_DIR: dataDir })
  t.teardown(() => second.stop('SIGKILL'))
  t.equal((await call(second.url, 'GET', '/v1/agents', oldKey)).status, 401, 'the revoked file key does not come back')
  t.equal((await call(second.url, 'GET', '/v1/agents', envKey)).status, 401, 'the environment key only while it is set')
  const newKey = readFileSync(keyFile, 'utf8').trim()
  t.not(newKey, oldKey, 'a new account key is in the key file')
  t.equal(statSync(keyFile).mode & 0o777, 0o600, 'still 0600')
  t.equal((await call(second.url, 'GET', '/v1/agents', newKey)).status, 200, 'and it works')
  const keys = (await call(second.url, 'GET', '/v1/keys', newKey)).body.keys as { keyId: string; prefix: string; revokedAt?: string }[]
  t.same(
    keys.filter((k) => !k.revokedAt).map((k) => k.prefix),
    [newKey.slice(0, 'rp_live_'.length + 4)],
    'the only active account key is the new one',
  )
  t.ok(keys.find((k) => k.keyId === bootstrap.keyId)?.revokedAt, 'the old one is listed as revoked')
  t.equal(keys.length, 2, 'the revoked one and the new one: no new record of the old key')
  // The file's path is logged as on a first start; the key itself is not (stdout is not a terminal).
  for (let i = 0; i < 50 && !second.stdout.some((l) => /created an account key/.test(l)); i++) await new Promise((r) => setTimeout(r, 100))
  t.ok(
    second.stdout.some((l) => /created an account key/.test(l) && JSON.parse(l).accountKeyFile === keyFile),
    'the key file path is logged',
  )
  t.notOk(
    [...second.stdout, ...second.stderr].some((l) => l.includes(newKey) || l.includes(oldKey)),
    'no account key in the output',
  )
  t.equal(await second.stop('SIGTERM'), 0)
})
