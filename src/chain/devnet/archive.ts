import * as fs from 'node:fs'
import * as path from 'node:path'
import type { AnvilNode } from './node.js'

type Receipt = { transactionHash: string }

/**
 * Receipts of every mined tx, on disk, for after anvil forgets them: anvil keeps the txs and
 * receipts of its newest `keepBlocks` blocks only (--transaction-block-keeper), so that its
 * memory and state dumps stay the same size however long the chain runs. A receipt (its
 * PaymentRecorded log holds every field of a ledger record) is appended when its block is
 * mined, to one of 256 files by the first byte of the tx hash; a lookup reads one file
 * (1/256 of the history). A line is `<hash> <receipt JSON>`; a block mined again by a replay
 * appends the same receipts again, and the first line found wins.
 */
export class ReceiptArchive {
  private readonly fds = new Map<string, number>()

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
    const byBucket = new Map<string, string[]>()
    for (const r of receipts) {
      const h = r.transactionHash.toLowerCase()
      const b = h.slice(2, 4)
      let lines = byBucket.get(b)
      if (!lines) byBucket.set(b, (lines = []))
      lines.push(`${h} ${JSON.stringify(r)}\n`)
    }
    for (const [b, lines] of byBucket) {
      let fd = this.fds.get(b)
      if (fd === undefined) this.fds.set(b, (fd = this.open(b)))
      fs.writeSync(fd, lines.join(''))
    }
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

  /** The archived receipt of `hash`, or null. */
  find(hash: string): unknown {
    const h = hash.toLowerCase()
    if (!/^0x[0-9a-f]{64}$/.test(h)) return null
    let text: string
    try {
      text = fs.readFileSync(this.file(h.slice(2, 4)), 'utf8')
    } catch {
      return null
    }
    let at = 0
    if (!text.startsWith(`${h} `)) {
      at = text.indexOf(`\n${h} `) + 1
      if (at === 0) return null
    }
    const end = text.indexOf('\n', at)
    if (end < 0) return null // a torn last line
    return JSON.parse(text.slice(at + h.length + 1, end)) as unknown
  }

  close(): void {
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
