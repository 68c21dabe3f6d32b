import t from 'tap'
import { PassThrough, Readable } from 'node:stream'
import { collect, collectUpTo, headThen } from '../../src/util/collect.js'

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

/** A stream holding `chunks` in its buffer, not yet ended, marked `complete` as an HTTP message would be. */
function buffered(chunks: string[], complete: boolean): Readable & { complete: boolean } {
  const s = Object.assign(new Readable({ read() {} }), { complete })
  for (const c of chunks) s.push(Buffer.from(c))
  return s
}

t.test('a body already all here is taken in one read, without data and end turns; the stream still ends and closes', async (t) => {
  // complete (an IncomingMessage or an upstream body that got its last byte)
  const done = buffered(['ab', 'cd'], true)
  done.push(null)
  const p = collectUpTo(done, 100)
  t.equal(done.listenerCount('data'), 0, 'no data listener: taken at once')
  t.same(await p, { head: Buffer.from('abcd'), rest: null })
  await new Promise((r) => done.once('close', r))
  t.ok(done.readableEnded, 'ended')

  // the bytes buffered are all the Content-Length said; the end comes later
  const early = buffered(['{"a":', '1}'], false)
  const q = collect(early, 100, tooLarge, 7)
  t.equal(early.listenerCount('data'), 0, 'taken at once')
  t.equal((await q).toString(), '{"a":1}')
  early.push(null)
  await new Promise((r) => early.once('end', r))
})

t.test('a body not all here, or over max, or decoded to strings, is read the usual way', async (t) => {
  const part = buffered(['abc'], false)
  const p = collect(part, 100, tooLarge, 6)
  t.equal(part.listenerCount('data'), 1, 'waits for the rest')
  part.push(Buffer.from('def'))
  part.push(null)
  t.equal((await p).toString(), 'abcdef')

  const big = buffered(['abcdef'], true)
  big.push(null)
  const { head, rest } = await collectUpTo(big, 4)
  t.equal(head.toString(), 'abcdef', 'the bytes read so far')
  t.ok(rest, 'and the rest of the stream, over max')
  rest?.destroy()

  const text = buffered(['abc'], true)
  text.setEncoding('utf8')
  text.push(null)
  const r = collect(text, 100, tooLarge)
  t.equal(text.listenerCount('data'), 1, 'decoded streams are read as they come')
  t.equal(String(await r), 'abc')
})
