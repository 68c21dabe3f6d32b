import t from 'tap'
import { Writable } from 'node:stream'
import { loadConfig, secretTexts } from '../../src/config/load.js'
import { createLogger, hideInLogs, scrubSecrets } from '../../src/log/index.js'
import { shownUrl, urlSecrets } from '../../src/util/redact.js'

t.test('shownUrl keeps a bare origin and cuts everything that may carry a credential', async (t) => {
  t.equal(shownUrl('http://127.0.0.1:8545'), 'http://127.0.0.1:8545', 'the embedded chain URL is shown as is')
  t.equal(shownUrl('https://rpc.example.com/'), 'https://rpc.example.com/')
  t.equal(shownUrl('https://mainnet.example.io/v3/0123abcd'), 'https://mainnet.example.io/[redacted]', 'a key in the path')
  t.equal(shownUrl('https://rpc.example.com/?apikey=k'), 'https://rpc.example.com/[redacted]', 'a key in the query')
  t.equal(shownUrl('wss://u:p@rpc.example.com:8546'), 'wss://rpc.example.com:8546/[redacted]', 'credentials in the userinfo')
  t.equal(shownUrl('not a url'), '[redacted url]')
})

t.test('urlSecrets lists every spelling a library may print, with what is shown instead', async (t) => {
  t.same(urlSecrets('http://127.0.0.1:8545'), [], 'nothing to hide')
  const url = 'https://user:longpassword@rpc.example.com/v2/KEY?x=1'
  const shown = 'https://rpc.example.com/[redacted]'
  t.same(
    new Map(urlSecrets(url)),
    new Map([
      [url, shown],
      ['longpassword', '[redacted]'],
      ['https://rpc.example.com/v2/KEY?x=1', shown],
    ]),
  )
  t.same(
    urlSecrets('https://u:short@h.example/'),
    [
      ['https://u:short@h.example/', 'https://h.example/[redacted]'],
      ['https://h.example/', 'https://h.example/[redacted]'],
    ],
    'a short password is not hidden on its own (it would match ordinary text)',
  )
})

t.test('secretTexts: every configured secret and credential-bearing URL', async (t) => {
  const { config } = loadConfig({
    env: {
      PAYGATE_MASTER_KEY: 'a'.repeat(64),
      PAYGATE_CHAIN_RPC_URL: 'https://rpc.example.com/v3/PATHKEY',
      PAYGATE_MPP_CARD_PROVIDER_URL: 'https://cards.example.com',
      PAYGATE_MPP_CARD_PROVIDER_KEY: 'card-key-123',
    },
  })
  const texts = new Map(secretTexts(config))
  t.equal(texts.get('a'.repeat(64)), '[redacted]')
  t.equal(texts.get('card-key-123'), '[redacted]')
  t.equal(texts.get('https://rpc.example.com/v3/PATHKEY'), 'https://rpc.example.com/[redacted]')
  t.notOk(
    [...texts.keys()].some((k) => k.startsWith('https://cards.example.com')),
    'a bare URL is not hidden',
  )
  t.same(secretTexts(loadConfig({}).config), [], 'the defaults hold no secret')
  const short = secretTexts(loadConfig({ env: { PAYGATE_MPP_CARD_PROVIDER_KEY: 'test' } }).config)
  t.same(short, [], 'a secret too short to tell from ordinary text is not scrubbed from every line')
})

t.test('a hidden text never reaches a log line, whatever carries it', async (t) => {
  let out = ''
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      out += chunk.toString()
      cb()
    },
  })
  const log = createLogger('info', sink)
  const url = 'https://rpc.example.com/v3/HIDDENKEY1'
  for (const [text, shown] of urlSecrets(url)) hideInLogs(text, shown)
  hideInLogs('https://rpc.example.com/v3/HIDDENKEY1', 'ignored: registered already')
  const err = new Error(`HTTP request failed.\n\nURL: ${url}\nRequest body: {}`)
  log.warn({ err, target: url }, `calling ${url} failed`)
  await new Promise((r) => setImmediate(r))
  t.notOk(out.includes('HIDDENKEY1'), 'not in the message, a field, the error message nor its stack')
  t.equal(out.split('https://rpc.example.com/[redacted]').length - 1, 4, 'the URL is shown by its origin in each of the four places')
  t.equal(scrubSecrets(`paygate: cannot start: ${url}`), 'paygate: cannot start: https://rpc.example.com/[redacted]')
  t.equal(scrubSecrets('nothing here'), 'nothing here')
})
