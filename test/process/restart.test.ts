import t from 'tap'
import { readFileSync, rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { tempDir } from '../helpers/gateway.js'
import { call, spawnGateway } from '../helpers/process.js'

t.test('agents, keys and policies survive SIGTERM and restart; revoked stays revoked', async (t) => {
  const dataDir = tempDir()
  t.teardown(() => rmSync(dataDir, { recursive: true, force: true }))
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
  const dataDir = tempDir()
  t.teardown(() => rmSync(dataDir, { recursive: true, force: true }))
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
