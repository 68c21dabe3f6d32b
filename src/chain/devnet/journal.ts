import * as fs from 'node:fs'
import { journalPath, type SnapshotMeta, writeSnapshot } from './data-dir.js'
import type { AnvilNode } from './node.js'
import { type BlocksBetween, type CutDump, HeaderCut, POOL_RESET_LINE, resendPool, TRIM_KEEP_HEADERS, trimAnvil } from './trim.js'
import { type DevnetLog, DevnetUnavailableError } from './types.js'

/** `as`: the account Paygate impersonates to send it (see RpcFront.sendLedger), again before a replay sends it. */
const asField = (as?: string): string => (as ? `,"as":${JSON.stringify(as)}` : '')
/** A journal line, from params already in JSON (as sent to anvil: each raw tx is encoded once). */
export const journalLine = (method: string, paramsJson: string, as?: string): string => `{"m":${JSON.stringify(method)},"p":${paramsJson}${asField(as)}}`
/** One line for a run of calls of one method (see sendRawTransactions), replayed pipelined. */
export const journalRun = (method: string, paramsJson: string[], as?: string): string => `{"m":${JSON.stringify(method)},"ps":[${paramsJson.join(',')}]${asField(as)}}`
export const journalCall = (method: string, params: unknown[]): string => journalLine(method, JSON.stringify(params))

/** The current journal: what a restart would replay after the newest snapshot. */
export interface Tail {
  /** calls in it */
  entries: number
  /** of those, the empty blocks mined only to bring chain time up to date */
  fresh: number
  /** estimated time to replay it (ms) */
  costMs: number
}

/** Where the current generation stands after a start (what replaying its journals found). */
export interface JournalStart {
  gen: number
  /** chain-time offset (s) relative to the wall clock */
  offset: number
  /** anvil's newest block at the last trim, as the base snapshot recorded it (0: none) */
  trimmedAt: number
  /** size of the newest snapshot (MB) */
  stateMb: number
  tail: Tail
}

export interface JournalOptions {
  dir: string
  restartBudgetMs: number
  /** trim old headers at a snapshot once this many blocks were mined since the last trim (see trim.ts) */
  trimEveryBlocks: number
  /** how long anvil may take to dump its state */
  dumpTimeoutMs: number
  log: DevnetLog
  /** anvil's CPU time so far (ms), to tell a dump's own cost from waiting for a busy machine */
  anvilCpuMs: () => number
}

/**
 * The current generation's journal, what replaying its tail would cost, and the snapshots that
 * start the next generation. Every line is written with write(2) before the call is answered.
 */
export class Journal {
  gen: number
  /** desired chain-time offset (s) relative to the wall clock */
  offset: number
  tail: Tail
  /** how long each of the last 50 snapshots held blocks back (the dump; sends go on beside it) */
  readonly snapshotMs: number[] = []
  /** snapshots taken since the start */
  snapshots = 0
  /** of those, the ones that trimmed old headers */
  trims = 0
  /**
   * anvil's newest block at the last trim (0: none). Kept in each snapshot's meta: a restart
   * loads a trimmed dump, so the blocks since that trim are what anvil holds beyond the kept headers.
   */
  private trimmedAt: number
  /** anvil's CPU time during each of those holds */
  readonly snapshotCpuMs: number[] = []
  private stateMb: number
  private fd: number
  // The chain is held only while anvil dumps; unpacking and writing the files happens after,
  // while new calls already go to the next journal.
  private commits: Promise<void> = Promise.resolve()

  constructor(
    private readonly opts: JournalOptions,
    start: JournalStart,
  ) {
    this.gen = start.gen
    this.offset = start.offset
    this.trimmedAt = start.trimmedAt
    this.stateMb = start.stateMb
    this.tail = start.tail
    this.fd = fs.openSync(journalPath(opts.dir, this.gen), 'a')
  }

  /** A journal line for `entries` calls. */
  append(line: string, entries = 1): void {
    fs.writeSync(this.fd, `${line}\n`)
    this.tail.entries += entries
  }

  /** An empty block mined only for chain time: marked so, a tail of them alone is not worth a snapshot at close. */
  appendFresh(timestamp: number): void {
    this.append(`{"m":"evm_mine","p":[${timestamp}],"f":1}`)
    this.tail.fresh++
  }

  /** Journals anvil's chain-time offset when it moved. */
  async recordOffset(node: AnvilNode): Promise<void> {
    const cur = Number(await node.raw('evm_increaseTime', [0]))
    if (cur !== this.offset) {
      this.offset = cur
      this.append(JSON.stringify({ o: this.offset }))
    }
  }

  /** Replaying more than this (ms) would take the restart past its budget. */
  tailBudgetMs(): number {
    return Math.max(1000, this.opts.restartBudgetMs - 6 * this.stateMb)
  }

  /** An idle snapshot is worth it when replaying the tail would cost at least half what the last snapshot cost. */
  idleSnapshotWorthIt(): boolean {
    return this.tail.costMs >= Math.max(100, (this.snapshotMs[this.snapshotMs.length - 1] ?? 0) / 2)
  }

  /** Whether close() should snapshot: a tail of blocks mined only for chain time replays in milliseconds. */
  closeSnapshotWorthIt(): boolean {
    return this.tail.entries > this.tail.fresh
  }

  /**
   * Dumps anvil's state and starts the next generation; its files are written in the background.
   * Run on the serial queue. The dump holds no mempool: the txs acknowledged and not yet mined
   * start the next journal, in the order they were sent, and a replay sends them again before
   * what came after (mining them first held the chain for a whole block more). Sends that come
   * while anvil dumps go on beside it (`AnvilNode.send`): they are pending at the switch, so they
   * start the next journal too. Only blocks (and setters) wait for the dump. After a trim the
   * next journal starts with the pool's reset instead, and the txs are journalled as they are
   * sent again, with `blocks` between them (`resendPool`); the snapshot is written only after.
   */
  async snapshot(node: AnvilNode, blocks?: BlocksBetween): Promise<void> {
    const t = performance.now()
    const cpu0 = this.opts.anvilCpuMs()
    // sends go on beside the dump (they fill the pool, which it does not hold), and beside the
    // cutting of a due trim's dump (the reset empties the pool, and the trim sends them again); blocks wait
    const cutter = this.trimDue(node) ? new HeaderCut() : undefined
    const { state, cut } = await node
      .beside(async () => {
        const state = await node.dumpState(this.opts.dumpTimeoutMs)
        return { state, cut: await cutter?.cut(state) }
      })
      .finally(() => cutter?.close())
    const reloadMs = cut ? await this.trim(node, cut) : 0
    const sm: SnapshotMeta = { offset: this.offset, blocks: node.blocks, at: new Date().toISOString(), trimmedAt: this.trimmedAt }
    const waiting = [...node.pending.values()]
    const next = this.gen + 1
    // the next journal starts with the txs still waiting in the mempool (e.g. nonce gaps)
    fs.writeFileSync(journalPath(this.opts.dir, next), cut ? `${POOL_RESET_LINE}\n` : waiting.map((l) => `${l}\n`).join(''))
    fs.closeSync(this.fd)
    this.fd = fs.openSync(journalPath(this.opts.dir, next), 'a')
    this.gen = next
    this.tail = { entries: cut ? 1 : waiting.length, fresh: 0, costMs: 0 }
    if (cut) await this.resend(node, waiting, { cutMs: cut.ms, reloadMs }, blocks)
    const ms = Math.round(performance.now() - t)
    this.snapshots++
    this.snapshotMs.push(ms)
    this.snapshotCpuMs.push(Math.round(this.opts.anvilCpuMs() - cpu0))
    if (this.snapshotMs.length > 50) this.snapshotMs.shift()
    if (this.snapshotCpuMs.length > 50) this.snapshotCpuMs.shift()
    const tc = performance.now()
    const log = this.opts.log
    this.commits = this.commits
      .then(async () => {
        this.stateMb = await writeSnapshot(this.opts.dir, next, cut?.json ?? state, sm)
      })
      .then(
        () => log('chain snapshot', { generation: next, blocks: sm.blocks, heldMs: ms, writeMs: Math.round(performance.now() - tc) }),
        (e: unknown) => log('writing a chain snapshot failed (the journals still hold everything)', { generation: next, error: String(e) }, 'warn'),
      )
  }

  /** Old headers are trimmed at a snapshot once enough blocks piled up (see trim.ts). */
  private trimDue(node: AnvilNode): boolean {
    return node.trimmable && !node.nextBlockTimeSet && node.blocks - this.trimmedAt >= this.opts.trimEveryBlocks
  }

  /** Trims anvil to the cut dump; resolves how long anvil took (ms). If anvil did not come back the same, the chain stops (a restart replays from the last snapshot). */
  private async trim(node: AnvilNode, cut: CutDump): Promise<number> {
    try {
      const ms = await trimAnvil(node, cut, this.offset)
      this.trimmedAt = node.blocks
      this.trims++
      return ms
    } catch (e) {
      throw this.trimFailed(node, e)
    }
  }

  /** After a trim, in the next journal: the pool's txs sent again (the chain stops if anvil refuses one). */
  private async resend(node: AnvilNode, lines: string[], times: { cutMs: number; reloadMs: number }, blocks?: BlocksBetween): Promise<void> {
    const t = performance.now()
    const blocks0 = node.blocks
    const cost0 = this.tail.costMs
    try {
      const resent = await resendPool(node, lines, ({ m, ps, as }) => this.append(ps.length === 1 ? journalLine(m, ps[0]!, as) : journalRun(m, ps, as), ps.length), blocks)
      // the whole resend, blocks included, once (each block added its own cost as it was mined)
      this.tail.costMs = cost0 + (performance.now() - t)
      const ms = Math.round(performance.now() - t)
      this.opts.log('chain: old block headers trimmed', { blocks: blocks0, kept: TRIM_KEEP_HEADERS, ...times, resent, resendMs: ms, minedBetween: node.blocks - blocks0 })
    } catch (e) {
      throw this.trimFailed(node, e)
    }
  }

  private trimFailed(node: AnvilNode, e: unknown): DevnetUnavailableError {
    const err = new DevnetUnavailableError(`embedded chain: trimming old headers failed (${String(e)}); restart Paygate`)
    node.fail(err)
    this.opts.log('trimming old block headers failed; the embedded chain refuses every call until Paygate restarts', { error: String(e) }, 'error')
    return err
  }

  /** Resolves when every snapshot taken so far is written (or failed). */
  written(): Promise<void> {
    return this.commits
  }

  close(): void {
    fs.fsyncSync(this.fd)
    fs.closeSync(this.fd)
  }
}
