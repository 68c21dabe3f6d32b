import t from 'tap'
import { createServer } from 'node:net'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { checkAnvilPath, checkPorts } from '../../src/config/checks.js'
import { loadConfig } from '../../src/config/load.js'
import { makeDataDir } from '../../src/store/index.js'
import { listen } from '../../src/util/listen.js'
import { testDir } from '../helpers/gateway.js'

/** Start refusals that name the setting at fault, where the system's own message named none. */
const config = (env: Record<string, string>) => loadConfig({ env }).config

t.test('api.port and proxy.port given one port', async (t) => {
  t.throws(() => checkPorts(config({ PAYGATE_API_PORT: '9999', PAYGATE_PROXY_PORT: '9999' })), {
    code: 'invalid_config',
    detail: 'api.port and proxy.port are both 9999: each listener needs its own port (0 picks a free one)',
  })
  t.throws(() => checkPorts(config({ PAYGATE_PROXY_PORT: '18545' })), { code: 'invalid_config', detail: /^proxy\.port and chain\.rpcPort are both 18545/ })
  t.doesNotThrow(() => checkPorts(config({ PAYGATE_API_PORT: '0', PAYGATE_PROXY_PORT: '0', PAYGATE_CHAIN_RPC_PORT: '0' })), '0 twice is two free ports')
  t.doesNotThrow(
    () => checkPorts(config({ PAYGATE_PROXY_PORT: '18545', PAYGATE_CHAIN_RPC_URL: 'http://127.0.0.1:8545', PAYGATE_CHAIN_TOKEN: `0x${'1'.repeat(40)}`, PAYGATE_CHAIN_LEDGER: `0x${'2'.repeat(40)}` })),
    'no embedded chain: its port is not used',
  )
})

t.test('chain.anvilPath that is not an executable file', async (t) => {
  t.throws(() => checkAnvilPath(config({ PAYGATE_CHAIN_ANVIL_PATH: '/nonexistent/anvil' })), {
    code: 'invalid_config',
    detail: 'chain.anvilPath = /nonexistent/anvil (PAYGATE_CHAIN_ANVIL_PATH): not an executable file (ENOENT)',
  })
  t.doesNotThrow(() => checkAnvilPath(config({ PAYGATE_CHAIN_ANVIL_PATH: process.execPath })))
})

t.test('a data directory that is a file', async (t) => {
  const file = join(testDir(t), 'not-a-dir')
  writeFileSync(file, '')
  t.throws(() => makeDataDir(file), { code: 'invalid_config', detail: new RegExp(`^the data directory ${file} cannot be used: EEXIST.*\\(dataDir, PAYGATE_DATA_DIR\\)$`) })
})

t.test('a bind address that is not this machine, named by its key', async (t) => {
  for (const [host, code] of [
    ['not-an-ip.invalid', /ENOTFOUND|EAI_AGAIN/],
    ['192.0.2.1', /EADDRNOTAVAIL/],
  ] as const) {
    const server = createServer()
    const err = await listen(server, 0, host, 'api.port').then(
      () => new Error('listened'),
      (e: Error) => e,
    )
    server.close()
    t.match(err.message, new RegExp(`^api\\.host = ${host.replace(/\./g, '\\.')}: cannot listen there \\(`), host)
    t.match(err.message, code)
  }
})
