/**
 * The trim's cut of a state dump, on its own thread: the newest TRIM_KEEP_HEADERS headers kept
 * in block order, the rest of the dump as it was; a dump it cannot read, or a closed thread,
 * rejects rather than hangs.
 */
import t from 'tap'
import { gunzipSync, gzipSync } from 'node:zlib'
import { HeaderCut, TRIM_KEEP_HEADERS } from '../../src/chain/devnet/trim.js'

const dumpOf = (numbers: number[]): string => {
  const dump = { block: { number: '0x1' }, accounts: { '0xabc': { nonce: 7 } }, blocks: numbers.map((n) => ({ header: { number: `0x${n.toString(16)}` }, transactions: [] })), transactions: [] }
  return `0x${gzipSync(Buffer.from(JSON.stringify(dump))).toString('hex')}`
}

t.test('keeps the newest headers in order, and the rest of the dump', async (t) => {
  const numbers = Array.from({ length: 700 }, (_, i) => i).sort(() => Math.random() - 0.5)
  const cutter = new HeaderCut()
  t.teardown(() => cutter.close())
  const cut = await cutter.cut(dumpOf(numbers))
  const json = JSON.parse(cut.json.toString('utf8')) as { blocks: { header: { number: string } }[]; accounts: unknown }
  t.same(
    json.blocks.map((b) => Number(b.header.number)),
    Array.from({ length: TRIM_KEEP_HEADERS }, (_, i) => 700 - TRIM_KEEP_HEADERS + i),
  )
  t.same(json.accounts, { '0xabc': { nonce: 7 } })
  t.same(gunzipSync(cut.gz), cut.json, 'the packed form is the same JSON')
  t.type(cut.ms, 'number')
})

t.test('a dump it cannot read rejects', async (t) => {
  const cutter = new HeaderCut()
  t.teardown(() => cutter.close())
  await t.rejects(cutter.cut('0x1f8b0000'))
})

t.test('a cut asked of a closed thread rejects, and one never asked leaves no unhandled rejection', async (t) => {
  const closed = new HeaderCut()
  closed.close()
  await t.rejects(closed.cut(dumpOf([1, 2])), /exited/)
  new HeaderCut().close()
  await new Promise((r) => setTimeout(r, 100))
})
