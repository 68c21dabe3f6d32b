import t from 'tap'
import { PassThrough, Readable } from 'node:stream'
import { collect, headThen } from '../../src/util/collect.js'

const tooLarge = (): Error => new Error('too large')

t.test('chunks are joined; a single chunk is returned as it is', async (t) => {
  t.equal((await collect(Readable.from([Buffer.from('ab'), Buffer.from('c'), Buffer.from('de')]), 100, tooLarge)).toString(), 'abcde')
  const one = Buffer.from('only')
  t.equal(await collect(Readable.from([one]), 100, tooLarge), one)
  t.equal((await collect(Readable.from([]), 100, tooLarge)).length, 0)
})

t.test('past max: the error from tooLarge, and the stream is destroyed', async (t) => {
  const s = new PassThrough()
  const read = collect(s, 4, tooLarge)
  s.write(Buffer.from('abc'))
  s.write(Buffer.from('de'))
  await t.rejects(read, /too large/)
  t.ok(s.destroyed)
  t.equal((await collect(Readable.from([Buffer.from('abcd')]), 4, tooLarge)).toString(), 'abcd', 'exactly max is fine')
})

t.test('a stream that errors or closes before its end rejects; listeners are removed', async (t) => {
  const failing = new PassThrough()
  const r1 = collect(failing, 100, tooLarge)
  failing.write('x')
  failing.destroy(new Error('reset'))
  await t.rejects(r1, /reset/)

  const cut = new PassThrough()
  const r2 = collect(cut, 100, tooLarge)
  cut.write('x')
  cut.destroy()
  await t.rejects(r2, /closed before it ended/)

  const ok = new PassThrough()
  const r3 = collect(ok, 100, tooLarge)
  ok.end('done')
  t.equal((await r3).toString(), 'done')
  t.same([ok.listenerCount('data'), ok.listenerCount('end'), ok.listenerCount('error'), ok.listenerCount('close')], [0, 0, 0, 0])
})

t.test('a stream already ended or destroyed answers at once', async (t) => {
  const ended = Readable.from([Buffer.from('x')])
  ended.resume()
  await new Promise((r) => ended.on('end', r))
  t.equal((await collect(ended, 100, tooLarge)).length, 0)
  const destroyed = new PassThrough()
  destroyed.destroy(new Error('gone'))
  await t.rejects(collect(destroyed, 100, tooLarge), /gone/)
})

t.test('headThen: the bytes read, then the rest; destroyed early, it destroys the rest too', async (t) => {
  const rest = new PassThrough()
  rest.end(Buffer.from(' world'))
  const chunks: Buffer[] = []
  for await (const c of headThen(Buffer.from('hello'), rest)) chunks.push(c as Buffer)
  t.equal(Buffer.concat(chunks).toString(), 'hello world')

  const stalled = new PassThrough() // a target that sends nothing more
  const s = headThen(Buffer.from('head'), stalled)
  s.destroy()
  await new Promise((r) => setImmediate(r))
  t.ok(stalled.destroyed, 'the upstream body is released')
})
