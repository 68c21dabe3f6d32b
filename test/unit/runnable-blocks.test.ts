import t from 'tap'
import { runnableBlocks } from '../helpers/runnable.js'

t.test('only sh blocks right under a runnable marker are taken, with their expectation', async (t) => {
  const md = [
    '# Doc',
    '<!-- runnable -->',
    '```sh',
    'echo one',
    'echo two',
    '```',
    '```sh',
    'echo not marked',
    '```',
    '<!-- runnable expect=/"ok":true/i -->',
    '```sh',
    'curl -s $API/healthz',
    '```',
    '<!-- runnable -->',
    '',
    '```sh',
    'echo marker not directly above',
    '```',
    '<!-- runnable -->',
    '```js',
    'not sh',
    '```',
  ].join('\n')
  const blocks = runnableBlocks(md)
  t.same(
    blocks.map((b) => [b.line, b.code, b.expect?.source ?? null, b.expect?.flags ?? null]),
    [
      [3, 'echo one\necho two', null, null],
      [11, 'curl -s $API/healthz', '"ok":true', 'i'],
    ],
  )
  t.throws(() => runnableBlocks('<!-- runnable -->\n```sh\necho open'), /not closed/)
})
