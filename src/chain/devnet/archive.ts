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
/** How long the newest bytes of the buckets scanned stay in memory after the last scan. */
const TAIL_KEEP_MS = 10_000
/** The most of one bucket's newest bytes kept, and of all buckets'. */
const TAIL_MAX = 4 * SCAN_CHUNK
const TAILS_MAX = 32 << 20

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
  /**
   * The newest bytes of each bucket as a scan read them (up to TAIL_MAX), while scans go on.
   * A restart confirms its backlog (thousands of records mined before the kill) one receipt
   * at a time, in the order they were mined, each near the end of its bucket: a read or two
   * per bucket then answers the rest from here, not a read or two each.
   */
  private readonly tails = new Map<string, { buf: Buffer; startsFile: boolean }>()
  private tailsBytes = 0
  private tailsTimer: NodeJS.Timeout | undefined
  private lastScanAt = 0
  /** Reads of the bucket files by lookups (a measure for tests). */
  fileReads = 0

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
      this.dropTail(b) // (no longer the bucket's newest bytes: a line written again for a hash must win)
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
    const bucket = h.slice(2, 4)
    const needle = Buffer.from(`${h} `)
    const tail = this.tails.get(bucket)
    const line = (tail && lineIn(tail.buf, needle, tail.startsFile)) ?? this.scanBack(bucket, needle)
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

  /** The line of `needle` in `bucket`, searched from the end in chunks; null when absent. */
  private scanBack(bucket: string, needle: Buffer): string | null {
    let fd: number
    try {
      fd = fs.openSync(this.file(bucket), 'r')
    } catch {
      return null
    }
    try {
      const size = fs.fstatSync(fd).size
      let end = size
      // Bytes after the chunk being read, up to the first newline in them (a line cut by the chunk's end).
      let carry = Buffer.alloc(0)
      // The chunks read, newest first, while they fit TAIL_MAX.
      const read: Buffer[] = []
      let found: string | null = null
      while (end > 0 && found === null) {
        const n = Math.min(SCAN_CHUNK, end)
        const chunk = Buffer.alloc(n)
        fs.readSync(fd, chunk, 0, n, end - n)
        this.fileReads++
        end -= n
        if ((read.length + 1) * SCAN_CHUNK <= TAIL_MAX) read.push(chunk)
        const buf = carry.length ? Buffer.concat([chunk, carry]) : chunk
        found = lineIn(buf, needle, end === 0)
        const nl = buf.indexOf(10)
        carry = nl < 0 ? buf : buf.subarray(0, nl + 1)
      }
      const kept = read.length === 1 ? read[0]! : Buffer.concat(read.reverse())
      this.keepTail(bucket, kept, kept.length === size)
      return found
    } finally {
      fs.closeSync(fd)
    }
  }

  private dropTail(bucket: string): void {
    const t = this.tails.get(bucket)
    if (!t) return
    this.tails.delete(bucket)
    this.tailsBytes -= t.buf.length
  }

  private keepTail(bucket: string, buf: Buffer, startsFile: boolean): void {
    this.dropTail(bucket)
    this.tails.set(bucket, { buf, startsFile })
    this.tailsBytes += buf.length
    for (const b of this.tails.keys()) {
      if (this.tailsBytes <= TAILS_MAX) break
      this.dropTail(b)
    }
    this.lastScanAt = Date.now()
    this.tailsTimer ??= setTimeout(() => this.expireTails(), TAIL_KEEP_MS).unref()
  }

  /** Drop the kept bytes once TAIL_KEEP_MS passed since the last scan (else look again then). */
  private expireTails(): void {
    const left = this.lastScanAt + TAIL_KEEP_MS - Date.now()
    if (left > 0) {
      this.tailsTimer = setTimeout(() => this.expireTails(), left).unref()
      return
    }
    this.tails.clear()
    this.tailsBytes = 0
    this.tailsTimer = undefined
  }

  close(): void {
    clearTimeout(this.tailsTimer)
    this.tails.clear()
    this.tailsBytes = 0
    this.flush()
    for (const fd of this.fds.values()) fs.closeSync(fd)
    this.fds.clear()
  }
}

/**
 * The line that starts with `needle` (`<hash> `) in `buf`, its receipt JSON, searched from the
 * end; null when absent. A match counts at a line's start only: after a newline, or at the
 * buffer's first byte when that is the file's. A torn last line (no newline) is skipped.
 */
function lineIn(buf: Buffer, needle: Buffer, startsFile: boolean): string | null {
  for (let at = buf.lastIndexOf(needle); at >= 0; at = at > 0 ? buf.lastIndexOf(needle, at - 1) : -1) {
    if (at === 0 ? !startsFile : buf[at - 1] !== 10) continue
    const stop = buf.indexOf(10, at)
    if (stop >= 0) return buf.subarray(at + needle.length, stop).toString('utf8')
  }
  return null
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
