import t from 'tap'
import { writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { loadConfig } from '../../src/config/load.js'
import { KEYS, envName } from '../../src/config/keys.js'
import { testDir } from '../helpers/gateway.js'

t.test('an empty environment value is unset: the default applies, also for required keys', async (t) => {
  const defaults = loadConfig({ cwd: '/srv' }).config
  const { config } = loadConfig({ cwd: '/srv', env: { PAYGATE_API_PORT: '', PAYGATE_LOG_LEVEL: '', PAYGATE_DATA_DIR: '', PAYGATE_API_HOST: '' } })
  t.equal(config.api.port, defaults.api.port)
  t.equal(config.log.level, defaults.log.level)
  t.equal(config.dataDir, defaults.dataDir)
  t.equal(config.dataDir, resolve('/srv', 'data'))
  t.equal(config.api.host, defaults.api.host)
})

t.test('an empty environment value leaves the config file value in place', async (t) => {
  const dir = testDir(t, 'paygate-config-env-')
  const file = join(dir, 'paygate.json')
  writeFileSync(file, JSON.stringify({ api: { port: 9999 }, log: { level: 'warn' }, proxy: { defaultAgent: 'bot' } }))
  const { config } = loadConfig({ env: { PAYGATE_CONFIG: file, PAYGATE_API_PORT: '', PAYGATE_LOG_LEVEL: '', PAYGATE_PROXY_DEFAULT_AGENT: '' } })
  t.equal(config.api.port, 9999)
  t.equal(config.log.level, 'warn')
  t.equal(config.proxy.defaultAgent, 'bot', 'an optional key too')
})

t.test('every key may be set empty in the environment', async (t) => {
  const env = Object.fromEntries(KEYS.map((k) => [envName(k.path), '']))
  t.same(loadConfig({ env }).config, loadConfig().config, 'the same configuration as with nothing set')
})

t.test('a flag given empty is still a value', async (t) => {
  t.throws(() => loadConfig({ argv: ['--api-port='] }), { code: 'invalid_config', message: /api\.port/ })
})
