import { appendFileSync, readdirSync, statSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { ReceiptArchive } from '../../src/chain/devnet/archive.js'
import { testDir } from '../helpers/gateway.js'

/** The embedded chain's receipt archive on a real directory: lookups from memory and from the files, across restarts. */
const hashOf = (i: number, bucket = 'ab'): string => `0x${bucket}${i.toString(16).padStart(62, '0')}`
const receipt = (i: number, bucket = 'ab') => ({ transactionHash: hashOf(i, bucket), blockNumber: `0x${(i >> 3).toString(16)}`, logs: [{ data: `0x${'5'.repeat(200)}`, i }] })

t.test('every receipt is found: recent ones and old ones, across chunk boundaries, after a restart', async (t) => {
  const dir = testDir(t)
  const archive = new ReceiptArchive(dir, 8)
  // One bucket (all hashes start 0xab) far past the in-memory window and many scan chunks.
  const N = 6000
  for (let i = 0; i < N; i += 8) archive.add(Array.from({ length: 8 }, (_, k) => receipt(i + k)))
  archive.add([receipt(1, 'cd')])
  t.ok(statSync(join(dir, 'receipts-ab.ndjson')).size > 1_000_000, 'the bucket spans many chunks')
  const check = (a: ReceiptArchive, label: string) => {
    let wrong = 0
    for (const i of [0, 1, 7, 8, 999, 1000, 2047, 3000, 4095, 5000, N - 1]) if ((a.find(hashOf(i)) as { logs: { i: number }[] } | null)?.logs[0]?.i !== i) wrong++
    for (let i = 0; i < N; i += 37) if ((a.find(hashOf(i).toUpperCase().replace('0X', '0x')) as { logs: { i: number }[] } | null)?.logs[0]?.i !== i) wrong++
    t.equal(wrong, 0, `${label}: each found, with its own receipt`)
    t.match(a.find(hashOf(1, 'cd')), { transactionHash: hashOf(1, 'cd') }, `${label}: another bucket`)
    t.equal(a.find(hashOf(N + 5)), null, `${label}: an unknown hash is null`)
    t.equal(a.find(hashOf(5, 'ef')), null, `${label}: a bucket never written is null`)
    t.equal(a.find('0x1234'), null, `${label}: not a hash`)
  }
  check(archive, 'the writer')
  archive.close()
  const again = new ReceiptArchive(dir, 8)
  check(again, 'after a restart (nothing in memory)')
  again.close()
})

t.test('a torn last line is never answered; the line before it still is; reopening drops it', async (t) => {
  const dir = testDir(t)
  const archive = new ReceiptArchive(dir, 8)
  archive.add([receipt(1), receipt(2)])
  archive.close()
  appendFileSync(join(dir, 'receipts-ab.ndjson'), `${hashOf(3)} {"transactionHash":"${hashOf(3)}","cut`)
  const reader = new ReceiptArchive(dir, 8)
  t.equal(reader.find(hashOf(3)), null, 'the torn receipt is not found')
  t.match(reader.find(hashOf(2)), { transactionHash: hashOf(2) })
  reader.add([receipt(4)])
  t.match(reader.find(hashOf(4)), { transactionHash: hashOf(4) })
  reader.close()
  const fresh = new ReceiptArchive(dir, 8)
  t.match(fresh.find(hashOf(4)), { transactionHash: hashOf(4) }, 'written after the torn line was dropped')
  t.equal(fresh.find(hashOf(3)), null)
  t.same(readdirSync(dir), ['receipts-ab.ndjson'])
  fresh.close()
})

t.test('receipts are gathered before they are written; every one is answered meanwhile; flush and close write them', async (t) => {
  const dir = testDir(t)
  const archive = new ReceiptArchive(dir, 8)
  const size = (): number => {
    try {
      return statSync(join(dir, 'receipts-ab.ndjson')).size
    } catch {
      return 0
    }
  }
  archive.add([receipt(1), receipt(2)])
  t.equal(size(), 0, 'a block alone is not written yet')
  t.match(archive.find(hashOf(2)), { transactionHash: hashOf(2) }, 'a gathered receipt is answered from memory')
  t.same(
    (archive.blockReceipts(0) as { transactionHash: string }[]).map((r) => r.transactionHash),
    [hashOf(1), hashOf(2)],
  )
  archive.flush()
  const flushed = size()
  t.ok(flushed > 0, 'flush() writes them')
  t.match(new ReceiptArchive(dir, 8).find(hashOf(2)), { transactionHash: hashOf(2) }, 'another reader finds them on disk')
  // Many blocks: written in a few large writes, never more than half the in-memory window held back.
  let i = 8
  for (; i < 8 + 2048; i += 8) archive.add(Array.from({ length: 8 }, (_, k) => receipt(i + k)))
  t.ok(size() > flushed, 'a full gather is written without a flush')
  const reader = new ReceiptArchive(dir, 8)
  t.match(reader.find(hashOf(8 + 2047)), { transactionHash: hashOf(8 + 2047) }, 'the newest of that gather is on disk')
  archive.add([receipt(i)])
  t.equal(reader.find(hashOf(i)), null, 'a receipt gathered after it is not, yet')
  archive.close()
  t.match(reader.find(hashOf(i)), { transactionHash: hashOf(i) }, 'close writes what was gathered')
})

t.test("a scan keeps its bucket's newest chunk: lookups near the end read the file once; a write to the bucket drops it", async (t) => {
  const dir = testDir(t)
  const writer = new ReceiptArchive(dir, 8)
  for (let i = 0; i < 400; i += 8) writer.add(Array.from({ length: 8 }, (_, k) => receipt(i + k)))
  writer.close()
  const archive = new ReceiptArchive(dir, 8)
  t.teardown(() => archive.close())
  // a restart's backlog: the newest receipts, asked one by one (about 400 bytes each: the last 100 fit one chunk)
  let wrong = 0
  for (let i = 300; i < 400; i++) if ((archive.find(hashOf(i)) as { logs: { i: number }[] } | null)?.logs[0]?.i !== i) wrong++
  t.equal(wrong, 0, 'each found, with its own receipt')
  t.equal(archive.fileReads, 1, 'one read of the bucket for all of them')
  t.match(archive.find(hashOf(0)), { transactionHash: hashOf(0) }, 'an older one is still found')
  t.ok(archive.fileReads > 1, 'by reading further back')

  // a receipt for the same hash written again (a block mined again) is the one answered from then on
  const reads = archive.fileReads
  t.ok(archive.find(hashOf(399)), 'from the kept chunk')
  t.equal(archive.fileReads, reads, 'no read')
  const again = { ...receipt(399), logs: [{ data: '0x', i: -1 }] }
  archive.add([again])
  // (then enough others that it leaves the recent receipts in memory)
  for (let i = 0; i < 4200; i += 8) archive.add(Array.from({ length: 8 }, (_, k) => receipt(i + k, 'cd')))
  archive.flush()
  t.match(archive.find(hashOf(399)), { logs: [{ i: -1 }] }, 'the line written last')
  t.equal(archive.fileReads, reads + 1, 'read from the file: the kept chunk was dropped when the bucket was written')
  archive.close()
  const reader = new ReceiptArchive(dir, 8)
  t.teardown(() => reader.close())
  t.match(reader.find(hashOf(399)), { logs: [{ i: -1 }] }, 'and from the file after a restart')
})
