import * as fs from 'node:fs'
import * as path from 'node:path'
import type { AnvilNode } from './node.js'

type Receipt = { transactionHash: string; blockNumber?: string }

/** Receipts kept in memory (about 1 KB each): several seconds of a busy chain. */
const RECENT = 4096
/**
 * Receipts gathered before they are written (at most half of RECENT: every one not yet written
 * is still answered from memory). Writing per block cost a write() per bucket a block touches,
 * about one per receipt; gathered, a write carries several.
 */
const GATHER = RECENT / 2
/** Blocks whose receipts are answered from memory (eth_getBlockReceipts once anvil forgot them). */
const RECENT_BLOCKS = 64
/** How much of a bucket one read takes, scanning back from its end. */
const SCAN_CHUNK = 64 * 1024

/**
 * Receipts of every mined tx, on disk, for after anvil forgets them: anvil keeps the txs and
 * receipts of its newest `keepBlocks` blocks only (--transaction-block-keeper), so that its
 * memory and state dumps stay the same size however long the chain runs. A receipt (its
 * PaymentRecorded log holds every field of a ledger record) is appended when its block is
 * mined, to one of 256 files by the first byte of the tx hash; a lookup reads one file
 * (1/256 of the history). A line is `<hash> <receipt JSON>`; a block mined again by a replay
 * appends the same receipts again, and the first line found wins.
 *
 * Lines are gathered in memory and written GATHER receipts at a time, and at every snapshot
 * (`flush()`, before the state is dumped) and close. A kill loses only lines of blocks mined
 * since the last snapshot: the restart mines those blocks again from the journal, and the
 * replay archives them again.
 */
export class ReceiptArchive {
  private readonly fds = new Map<string, number>()
  /** The newest RECENT receipts archived by this process, by hash (insertion order: oldest first). */
  private readonly recent = new Map<string, string>()
  /** The newest RECENT_BLOCKS archived blocks: number -> their txs' hashes. */
  private readonly recentBlocks = new Map<number, string[]>()
  /** Lines not yet written, by bucket, and how many. */
  private gathered = new Map<string, string[]>()
  private gatheredCount = 0

  constructor(
    private readonly dir: string,
    /** how many newest blocks anvil keeps */
    readonly keep: number,
  ) {
    fs.mkdirSync(dir, { recursive: true })
  }

  private file(bucket: string): string {
    return path.join(this.dir, `receipts-${bucket}.ndjson`)
  }

  /** Appends a block's receipts (as anvil's eth_getBlockReceipts gives them). */
  add(receipts: Receipt[]): void {
    const n = Number(receipts[0]?.blockNumber)
    if (Number.isSafeInteger(n)) {
      this.recentBlocks.delete(n) // (a block mined again by a replay: newest last)
      this.recentBlocks.set(
        n,
        receipts.map((r) => r.transactionHash.toLowerCase()),
      )
      if (this.recentBlocks.size > RECENT_BLOCKS) this.recentBlocks.delete(this.recentBlocks.keys().next().value!)
    }
    for (const r of receipts) {
      const h = r.transactionHash.toLowerCase()
      const b = h.slice(2, 4)
      let lines = this.gathered.get(b)
      if (!lines) this.gathered.set(b, (lines = []))
      const json = JSON.stringify(r)
      lines.push(`${h} ${json}\n`)
      this.remember(h, json)
    }
    this.gatheredCount += receipts.length
    if (this.gatheredCount >= GATHER) this.flush()
  }

  /** Writes the gathered lines, one write per bucket. */
  flush(): void {
    const gathered = this.gathered
    this.gathered = new Map()
    this.gatheredCount = 0
    for (const [b, lines] of gathered) {
      let fd = this.fds.get(b)
      if (fd === undefined) this.fds.set(b, (fd = this.open(b)))
      fs.writeSync(fd, lines.join(''))
    }
  }

  private remember(h: string, json: string): void {
    this.recent.set(h, json)
    if (this.recent.size > RECENT) this.recent.delete(this.recent.keys().next().value!)
  }

  /** Opens a bucket for appending, dropping a line torn by a kill mid-write (reads the end only: a bucket grows with history). */
  private open(bucket: string): number {
    const f = this.file(bucket)
    const fd = fs.openSync(f, 'a+')
    const size = fs.fstatSync(fd).size
    if (size > 0) {
      const n = Math.min(size, 1 << 20)
      const tail = Buffer.alloc(n)
      fs.readSync(fd, tail, 0, n, size - n)
      if (tail[n - 1] !== 10) {
        const nl = tail.lastIndexOf(10)
        fs.ftruncateSync(fd, nl < 0 ? size - n : size - n + nl + 1)
      }
    }
    return fd
  }

  /**
   * The archived receipt of `hash`, or null. Recent receipts (the ones asked for: a payment
   * confirmed a few blocks after anvil forgot it) are answered from memory; older ones by
   * reading the bucket backwards from its end, so a lookup never reads more history than
   * it must.
   */
  find(hash: string): unknown {
    const h = hash.toLowerCase()
    if (!/^0x[0-9a-f]{64}$/.test(h)) return null
    const recent = this.recentReceipt(h)
    if (recent !== undefined) return recent
    const line = this.scanBack(h)
    return line === null ? null : (JSON.parse(line) as unknown)
  }

  /** The receipt of `hash` if it is among the recent ones (memory only), else undefined. */
  recentReceipt(hash: string): unknown {
    const json = this.recent.get(hash.toLowerCase())
    return json === undefined ? undefined : (JSON.parse(json) as unknown)
  }

  /**
   * A recent block's receipts, in block order, from memory: the outbox asks for a block's
   * receipts a few blocks after it was mined, often after anvil forgot its txs. Null when this
   * block is not among the recent ones (or one of its receipts left memory).
   */
  blockReceipts(n: number): unknown[] | null {
    const hashes = this.recentBlocks.get(n)
    if (!hashes) return null
    const out: unknown[] = []
    for (const h of hashes) {
      const json = this.recent.get(h)
      if (json === undefined) return null
      out.push(JSON.parse(json))
    }
    return out
  }

  /** The receipt JSON of `h` in its bucket, searched from the end in chunks; null when absent. */
  private scanBack(h: string): string | null {
    let fd: number
    try {
      fd = fs.openSync(this.file(h.slice(2, 4)), 'r')
    } catch {
      return null
    }
    try {
      const needle = Buffer.from(`${h} `)
      let end = fs.fstatSync(fd).size
      // Bytes after the chunk being read, up to the first newline in them (a line cut by the chunk's end).
      let carry = Buffer.alloc(0)
      while (end > 0) {
        const n = Math.min(SCAN_CHUNK, end)
        const chunk = Buffer.alloc(n)
        fs.readSync(fd, chunk, 0, n, end - n)
        end -= n
        const buf = carry.length ? Buffer.concat([chunk, carry]) : chunk
        for (let at = buf.lastIndexOf(needle); at >= 0; at = at > 0 ? buf.lastIndexOf(needle, at - 1) : -1) {
          // A line's start: the file's first byte, or after a newline (within this buffer).
          if (at === 0 ? end !== 0 : buf[at - 1] !== 10) continue
          const stop = buf.indexOf(10, at)
          if (stop < 0) break // a torn last line
          return buf.subarray(at + needle.length, stop).toString('utf8')
        }
        const nl = buf.indexOf(10)
        carry = nl < 0 ? buf : buf.subarray(0, nl + 1)
      }
      return null
    } finally {
      fs.closeSync(fd)
    }
  }

  close(): void {
    this.flush()
    for (const fd of this.fds.values()) fs.closeSync(fd)
    this.fds.clear()
  }
}

/**
 * Archives the receipts of blocks `from`..`to` (those anvil still keeps: the newest `keep`).
 * Call it right after they are mined, before anvil forgets them.
 */
export async function archiveBlocks(node: AnvilNode, archive: ReceiptArchive, from: number, to: number): Promise<void> {
  for (let n = Math.max(from, to - archive.keep + 1); n <= to; n++) {
    const rs = (await node.raw('eth_getBlockReceipts', [`0x${n.toString(16)}`])) as Receipt[] | null
    if (rs?.length) archive.add(rs)
  }
}
