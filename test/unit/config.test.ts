import t from 'tap'
import { rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { loadConfig } from '../../src/config/load.js'
import { KEYS, envName, flagName } from '../../src/config/keys.js'
import defaults from '../../config/default.json' with { type: 'json' }
import { tempDir } from '../helpers/gateway.js'

t.test('env names and flags follow one rule', async (t) => {
  t.equal(envName('chain.rpcUrl'), 'PAYGATE_CHAIN_RPC_URL')
  t.equal(envName('dataDir'), 'PAYGATE_DATA_DIR')
  t.equal(envName('upstream.caFile'), 'PAYGATE_UPSTREAM_CA_FILE')
  t.equal(flagName('api.rateLimit.perMinute'), '--api-rate-limit-per-minute')
  const required = [
    'PAYGATE_DATA_DIR',
    'PAYGATE_API_HOST',
    'PAYGATE_API_PORT',
    'PAYGATE_PROXY_HOST',
    'PAYGATE_PROXY_PORT',
    'PAYGATE_CERTS_DIR',
    'PAYGATE_ACCOUNT_KEY',
    'PAYGATE_MASTER_KEY',
    'PAYGATE_CHAIN_RPC_URL',
    'PAYGATE_UPSTREAM_CA_FILE',
  ]
  const names = KEYS.map((k) => envName(k.path))
  for (const n of required) t.ok(names.includes(n), n)
})

t.test('default.json and the key table describe the same keys', async (t) => {
  const flat: string[] = []
  const walk = (o: Record<string, unknown>, p: string): void => {
    for (const [k, v] of Object.entries(o)) {
      const path = p ? `${p}.${k}` : k
      const isMap = KEYS.some((k) => k.path === path && k.kind === 'map')
      if (v && typeof v === 'object' && !Array.isArray(v) && !isMap) walk(v as Record<string, unknown>, path)
      else flat.push(path)
    }
  }
  walk(defaults as Record<string, unknown>, '')
  t.same(flat.sort(), KEYS.map((k) => k.path).sort())
})

t.test('precedence: default < file < env < flag', async (t) => {
  const dir = tempDir()
  const file = join(dir, 'c.json')
  writeFileSync(file, JSON.stringify({ api: { port: 1111, host: '0.0.0.0' }, log: { level: 'warn' } }))
  const { config: a } = loadConfig({ env: { PAYGATE_CONFIG: file }, cwd: dir })
  t.equal(a.api.port, 1111)
  t.equal(a.api.host, '0.0.0.0')
  t.equal(a.proxy.port, 8402, 'default kept')
  t.equal(a.dataDir, join(dir, 'data'), 'paths resolve against the working directory')
  const { config: b } = loadConfig({ env: { PAYGATE_CONFIG: file, PAYGATE_API_PORT: '2222' }, cwd: dir })
  t.equal(b.api.port, 2222)
  const { config: c } = loadConfig({ env: { PAYGATE_CONFIG: file, PAYGATE_API_PORT: '2222' }, argv: ['--api-port', '0', '--log.level=debug'], cwd: dir })
  t.equal(c.api.port, 0)
  t.equal(c.log.level, 'debug')
  const { config: d } = loadConfig({ argv: ['--config', file], cwd: dir })
  t.equal(d.api.port, 1111, '--config names the file too')
})

t.test('bad values stop the start naming key, value and what is allowed', async (t) => {
  const check = (input: Parameters<typeof loadConfig>[0], ...want: RegExp[]): void => {
    try {
      loadConfig(input)
      t.fail('expected an error')
    } catch (e) {
      const msg = (e as Error).message
      for (const w of want) t.match(msg, w)
    }
  }
  check({ env: { PAYGATE_API_PORT: '70000' } }, /api\.port = "70000"/, /PAYGATE_API_PORT/, /integer port 0-65535/)
  check({ env: { PAYGATE_LOG_LEVEL: 'loud' } }, /log\.level = "loud"/, /one of trace, debug/)
  check({ env: { PAYGATE_CHAIN_RPC_URL: 'not a url' } }, /chain\.rpcUrl/, /http\(s\) or ws\(s\) URL/)
  check({ argv: ['--api-host', 'bad host!'] }, /api\.host/, /--api-host/, /hostname or IP/)
  check({ env: { PAYGATE_ACCOUNT_KEY: 'rp_live_short' } }, /accountKey = <redacted, 13 characters>/, /rp_live_ followed by 32 to 128/)
  check({ env: { PAYGATE_ACCOUNT_KEY: `rp_live_${'a'.repeat(129)}` } }, /accountKey = <redacted, 137 characters>/, /32 to 128/)
  check({ env: { PAYGATE_PROXY_IDLE_TIMEOUT_MS: '10' } }, /proxy\.idleTimeoutMs = "10"/)
  check({ env: { PAYGATE_MASTER_KEY: 'secretvalue' } }, /masterKey = <redacted/)
  check({ env: { PAYGATE_API_RATE_LIMIT_PER_MINUTE: '0' } }, /api\.rateLimit\.perMinute = "0"/, /integer from 1/)
  const dir = tempDir()
  writeFileSync(join(dir, 'c.json'), JSON.stringify({ api: { prot: 1 } }))
  check({ env: { PAYGATE_CONFIG: join(dir, 'c.json') } }, /api\.prot .* is not a known configuration key/)
  writeFileSync(join(dir, 'bad.json'), '{nope')
  check({ env: { PAYGATE_CONFIG: join(dir, 'bad.json') } }, /not valid JSON/)
  check({ argv: ['--api-port'] }, /needs a value/)
  // A secret's value never appears in the message.
  try {
    loadConfig({ env: { PAYGATE_MASTER_KEY: 'supersecretmaterial' } })
    t.fail('an invalid master key must be refused')
  } catch (e) {
    t.notMatch((e as Error).message, /supersecretmaterial/)
  }
})

t.test('valid secrets and optional keys', async (t) => {
  const { config } = loadConfig({
    env: { PAYGATE_ACCOUNT_KEY: `rp_live_${'a'.repeat(32)}`, PAYGATE_MASTER_KEY: 'ab'.repeat(32), PAYGATE_CHAIN_RPC_URL: '' },
  })
  t.equal(config.accountKey, `rp_live_${'a'.repeat(32)}`)
  t.equal(config.chain.rpcUrl, null, 'empty means unset')
  const b64 = Buffer.alloc(32, 7).toString('base64')
  t.equal(loadConfig({ env: { PAYGATE_MASTER_KEY: b64 } }).config.masterKey, b64)
})

t.test('a private key outside the secp256k1 range stops the start, naming the key, never its value', async (t) => {
  const n = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n
  const hex = (k: bigint): string => `0x${k.toString(16).padStart(64, '0')}`
  for (const bad of [`0x${'f'.repeat(64)}`, hex(0n), hex(n), hex(n + 1n)]) {
    try {
      loadConfig({ env: { PAYGATE_CHAIN_SIGNER_KEY: bad } })
      t.fail(`${bad} must be refused`)
    } catch (e) {
      const err = e as Error & { code?: string }
      t.equal(err.code, 'invalid_config', 'a config error: the start exits with code 2')
      t.match(err.message, /chain\.signerKey = <redacted, 66 characters>/)
      t.match(err.message, /PAYGATE_CHAIN_SIGNER_KEY/)
      t.match(err.message, /secp256k1 private key/)
      const decimal = BigInt(bad).toString()
      t.notOk(err.message.includes(bad.slice(2)) || (decimal.length > 8 && err.message.includes(decimal)), 'the value is not echoed, in hex or decimal')
    }
  }
  for (const good of [hex(1n), hex(n - 1n)]) t.equal(loadConfig({ env: { PAYGATE_CHAIN_SIGNER_KEY: good } }).config.chain.signerKey, good)
})

t.test('a config file must hold an object of settings; a map in it may give numbers', async (t) => {
  const dir = tempDir()
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const file = join(dir, 'paygate.json')
  for (const [text, what] of [
    ['[1,2]', 'an array'],
    ['"str"', 'a string'],
    ['null', 'null'],
    ['8403', 'a number'],
  ] as const) {
    writeFileSync(file, text)
    t.throws(() => loadConfig({ env: { PAYGATE_CONFIG: file } }), { code: 'invalid_config', detail: new RegExp(`config file .* must hold a JSON object of settings .*, not ${what}$`) }, text)
  }
  writeFileSync(file, JSON.stringify({ mpp: { rates: { EUR: 1.08, JPY: 0.0067, GBP: '1.27' } } }))
  t.same(loadConfig({ env: { PAYGATE_CONFIG: file } }).config.mpp.rates, { EUR: '1.08', JPY: '0.0067', GBP: '1.27' })
  writeFileSync(file, JSON.stringify({ mpp: { rates: { EUR: -1 } } }))
  t.throws(() => loadConfig({ env: { PAYGATE_CONFIG: file } }), { code: 'invalid_config', detail: /mpp\.rates = \{"EUR":-1\}/ }, 'a number is checked as its text is')
})

t.test('smtp.url and smtp.from go together: one without the other stops the load, naming both keys and where they came from', async (t) => {
  const refused = (input: Parameters<typeof loadConfig>[0]): string => {
    try {
      loadConfig(input)
    } catch (e) {
      t.equal((e as { code?: string }).code, 'invalid_config')
      return (e as Error).message
    }
    t.fail('expected an error')
    return ''
  }
  const url = 'smtp://user:hunter2@mail.example.com:587'
  const a = refused({ env: { PAYGATE_SMTP_URL: url } })
  t.match(a, /smtp\.url = <redacted, \d+ characters> \(from PAYGATE_SMTP_URL\) is set but smtp\.from is not \(from config\/default\.json; set PAYGATE_SMTP_FROM\)/)
  t.notMatch(a, /hunter2/, 'the URL (a secret) is not echoed')
  const dir = tempDir()
  writeFileSync(join(dir, 'c.json'), JSON.stringify({ smtp: { from: 'Paygate <alerts@example.com>' } }))
  const b = refused({ env: { PAYGATE_CONFIG: join(dir, 'c.json') }, cwd: dir })
  t.match(b, /smtp\.from = "Paygate <alerts@example\.com>" \(from .*c\.json; or set PAYGATE_SMTP_FROM\) is set but smtp\.url is not/)
  t.match(refused({ argv: ['--smtp-url', url] }), /\(from --smtp-url\)/)
  const { config } = loadConfig({ env: { PAYGATE_SMTP_URL: url, PAYGATE_SMTP_FROM: 'Paygate <alerts@example.com>' } })
  t.same(config.smtp, { url, from: 'Paygate <alerts@example.com>' }, 'both: loaded')
  t.same(loadConfig({}).config.smtp, { url: null, from: null }, 'neither: loaded')
})
