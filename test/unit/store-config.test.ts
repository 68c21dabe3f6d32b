import t from 'tap'
import { loadConfig, secretTexts } from '../../src/config/load.js'
import { checkSharedStore } from '../../src/config/checks.js'

const URL_WITH_PASSWORD = 'postgres://paygate:hunter2hunter2@db.internal:5432/paygate'

t.test('store.postgresUrl: from PAYGATE_STORE_POSTGRES_URL, unset by default, a secret', async (t) => {
  t.equal(loadConfig({ env: {} }).config.store.postgresUrl, null, 'LevelDB by default')
  const { config } = loadConfig({ env: { PAYGATE_STORE_POSTGRES_URL: URL_WITH_PASSWORD } })
  t.equal(config.store.postgresUrl, URL_WITH_PASSWORD)
  t.ok(
    secretTexts(config).some(([text]) => text === URL_WITH_PASSWORD),
    'kept out of logs',
  )
  t.equal(loadConfig({ argv: ['--store-postgres-url', 'postgresql://127.0.0.1/x'] }).config.store.postgresUrl, 'postgresql://127.0.0.1/x')
})

t.test('store.postgresUrl: anything but a postgres URL is refused without echoing it', async (t) => {
  for (const bad of ['http://db.internal:5432/paygate', 'not a url at all here', 'postgres:///nohost']) {
    try {
      loadConfig({ env: { PAYGATE_STORE_POSTGRES_URL: bad } })
      t.fail(`${bad} must be refused`)
    } catch (e) {
      t.match((e as Error).message, /store\.postgresUrl = <redacted/)
      t.match((e as Error).message, /postgres:\/\/ or postgresql:\/\/ URL/)
      t.notMatch((e as Error).message, bad)
    }
  }
})

t.test('with PostgreSQL a start needs the shared master key and an external chain', async (t) => {
  const env = { PAYGATE_STORE_POSTGRES_URL: URL_WITH_PASSWORD }
  const chain = { PAYGATE_CHAIN_RPC_URL: 'http://127.0.0.1:8545', PAYGATE_CHAIN_TOKEN: `0x${'1'.repeat(40)}`, PAYGATE_CHAIN_LEDGER: `0x${'2'.repeat(40)}` }
  const masterKey = { PAYGATE_MASTER_KEY: 'ab'.repeat(32) }
  t.throws(() => checkSharedStore(loadConfig({ env: { ...env, ...chain } }).config), /set masterKey \(PAYGATE_MASTER_KEY\), the same on every replica/)
  t.throws(() => checkSharedStore(loadConfig({ env: { ...env, ...masterKey } }).config), /set chain\.rpcUrl \(PAYGATE_CHAIN_RPC_URL\)/)
  t.throws(() => checkSharedStore(loadConfig({ env }).config), { code: 'invalid_config', message: /masterKey.*; and chain\.rpcUrl/ })
  t.doesNotThrow(() => checkSharedStore(loadConfig({ env: { ...env, ...chain, ...masterKey } }).config))
  t.doesNotThrow(() => checkSharedStore(loadConfig({ env: {} }).config), 'LevelDB needs neither')
})
