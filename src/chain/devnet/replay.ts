import * as fs from 'node:fs'
import { archiveBlocks, type ReceiptArchive } from './archive.js'
import { type Generations, journalPath } from './data-dir.js'
import { type JournalStart, journalLine, type Tail } from './journal.js'
import { MINES, SENDS, SET_NEXT_TIME } from './methods.js'
import type { AnvilNode } from './node.js'
import { trimSafe } from './trim.js'
import type { DevnetLog, RpcResponse } from './types.js'

type Entry = { o?: number; pool?: 'reset'; m?: string; p?: unknown[]; ps?: unknown[][]; f?: 1; as?: string }

/** What a replay did, and where the journal it leaves stands. */
export interface Restored {
  journal: JournalStart
  replayed: number
  replayMs: number
}

/**
 * Brings anvil (started from the base snapshot) to where the journals leave the chain: same tx
 * hashes, blocks, block hashes and timestamps; then the chain-time offset they recorded.
 */
export async function restore(node: AnvilNode, archive: ReceiptArchive, dir: string, gens: Generations, log: DevnetLog): Promise<Restored> {
  const t = performance.now()
  const r = new Replay(node, archive, log, gens)
  for (const g of gens.journals) await r.journal(journalPath(dir, g), g)
  if (r.failures) log('journal replay finished with failures', { failures: r.failures }, 'warn')
  await node.dropMined()
  const replayMs = performance.now() - t

  // chain-time: explicit-timestamp mines during replay moved anvil's offset; put it back
  await node.setTimeOffset(r.offset).catch((e: unknown) => log('could not put the chain-time offset back', { offset: r.offset, error: String(e) }, 'warn'))
  node.blocks = Number((await node.latestMined()).number)
  const journal: JournalStart = { gen: gens.gen, offset: r.offset, trimmedAt: gens.trimmedAt, stateMb: gens.stateMb, tail: r.tail }
  return { journal, replayed: r.replayed, replayMs }
}

class Replay {
  offset: number
  readonly tail: Tail = { entries: 0, fresh: 0, costMs: 0 }
  replayed = 0
  failures = 0

  constructor(
    private readonly node: AnvilNode,
    private readonly archive: ReceiptArchive,
    private readonly log: DevnetLog,
    gens: Generations,
  ) {
    this.offset = gens.offset
  }

  async journal(file: string, g: number): Promise<void> {
    let text = fs.readFileSync(file, 'utf8')
    const end = text.lastIndexOf('\n') + 1
    if (end !== text.length) {
      this.log('dropping a torn journal tail', { journal: g, bytes: text.length - end }, 'warn')
      fs.truncateSync(file, Buffer.byteLength(text.slice(0, end)))
      text = text.slice(0, end)
    }
    let pos = 0
    while (pos < text.length) {
      const nl = text.indexOf('\n', pos)
      await this.line(text.slice(pos, nl))
      pos = nl + 1
    }
  }

  private async line(line: string): Promise<void> {
    const node = this.node
    const entry = JSON.parse(line) as Entry
    if (entry.o !== undefined) {
      this.tail.entries++
      this.offset = entry.o
      return
    }
    if (entry.pool === 'reset') {
      // a trim emptied anvil's pool here, and its txs follow as they were sent again, with the
      // blocks mined between them; a replay from the snapshot before (this one's files
      // unwritten) still has them in anvil's pool
      await node.raw('anvil_dropAllTransactions')
      node.pending.clear()
      this.tail.entries++
      return
    }
    // A batch line (one sender's run, see sendRawTransactions) goes back to anvil the way it
    // came: pipelined, in one write. The rest, one call at a time, in journal order; so do the
    // blocks of a run of mines (a caller's anvil_mine, see RpcFront.mined): each builds on the one
    // before, and anvil may run pipelined calls concurrently.
    const m = entry.m!
    if (!trimSafe(m)) node.trimmable = false
    if (SET_NEXT_TIME.test(m)) node.nextBlockTimeSet = true
    else if (MINES.has(m)) node.nextBlockTimeSet = false
    if (entry.as) await node.impersonate(entry.as)
    const calls = (entry.ps ?? [entry.p ?? []]).map((c) => JSON.stringify(c))
    // blocks a caller mined (anvil_mine: several) go into the receipt archive after
    const several = MINES.has(m) && (m !== 'evm_mine' || entry.ps !== undefined)
    const before = several ? Number(await node.raw('eth_blockNumber')) : -1
    const t = performance.now()
    const rs = !entry.ps ? [await node.ipc.call(m, calls[0]!)] : MINES.has(m) ? await inTurn(node, m, calls) : await node.ipc.callMany(m, calls)
    this.tail.costMs += performance.now() - t
    this.tail.entries += calls.length
    if (entry.f) this.tail.fresh++
    this.replayed += calls.length
    rs.forEach((r, i) => {
      if (r.error) {
        // e.g. a carried-over pending tx that the previous journal already sent
        if (++this.failures <= 5) this.log('journal replay: call failed', { method: m, error: r.error.message }, 'warn')
      } else if (SENDS.has(m) && typeof r.result === 'string') node.pending.set(r.result.toLowerCase(), entry.ps ? journalLine(m, calls[i]!, entry.as) : line)
    })
    // What a block mined is no longer pending: one read per block here saves asking after
    // every replayed tx below (that took longer than the replay itself).
    // A block mined again goes into the receipt archive again (it may have died before it did).
    if (m === 'evm_mine' && !several && !rs[0]!.error) {
      const b = await node.latestMined()
      if (b.transactions.length) await archiveBlocks(node, this.archive, Number(b.number), Number(b.number))
    } else if (before >= 0 && !rs[0]!.error) await archiveBlocks(node, this.archive, before + 1, Number(await node.raw('eth_blockNumber')))
  }
}

/** Calls of one method, each sent once the one before is answered. */
async function inTurn(node: AnvilNode, method: string, calls: string[]): Promise<RpcResponse[]> {
  const rs: RpcResponse[] = []
  for (const c of calls) rs.push(await node.ipc.call(method, c))
  return rs
}
