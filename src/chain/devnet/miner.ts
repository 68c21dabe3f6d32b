import { archiveBlocks, type ReceiptArchive } from './archive.js'
import { type Journal, journalCall } from './journal.js'
import type { AnvilNode } from './node.js'
import type { DevnetLog } from './types.js'

const MIN_BLOCK_GAP_MS = 10
/**
 * Waiting txs that make a block now, and the most a long send puts in anvil's pool before one is
 * mined (see mineIfFull). Every call waits while anvil mines a block and serves its receipts, and
 * the receipts cost grows with the square of the block: anvil hashes every tx of the block for
 * each receipt it builds, and an unsigned tx (the ledger's, see RpcFront.sendLedger) has no
 * hash kept, so it is hashed anew each time. Under load, blocks of 32 cost anvil about half
 * what blocks of 128 did per ledger record (docs/benchmarks.md), with a mined block's own cost
 * (about 1 ms) still spread over many.
 */
export const FULL_BLOCK_TXS = 32

export interface MinerOptions {
  blockTimeMs: number
  idleSnapshotMs: number
  freshBlockMs: number
  log: DevnetLog
}

/**
 * anvil runs with --no-mining: this mines the txs it acknowledged, takes snapshots when the chain
 * is idle or the journal tail grows past its budget, and mines an empty block before a read that
 * would otherwise see a stale chain time.
 */
export class Miner {
  automine = true
  /** moving average of an evm_mine (ms) */
  mineMs = 3
  /** last state-changing request received */
  private lastWriteAt = Date.now()
  private lastMineAt = 0
  private lastBlockTxs = 0
  private mineTimer: NodeJS.Timeout | undefined
  /** when the scheduled block is due (ms since the epoch) */
  private mineDueAt = 0
  private idleTimer: NodeJS.Timeout | undefined
  private snapshotQueued = false
  private freshening: Promise<void> | null = null
  private lastFreshAt = 0

  constructor(
    private readonly node: AnvilNode,
    private readonly journal: Journal,
    private readonly archive: ReceiptArchive,
    private readonly opts: MinerOptions,
  ) {}

  /** Mines what a replay left pending and starts the idle snapshot check. */
  start(): void {
    if (this.node.pending.size) this.schedule()
    this.idleTimer = setInterval(() => this.idleSnapshot(), 500)
    this.idleTimer.unref()
  }

  /** No more timers (close, or anvil gone). */
  stop(): void {
    clearInterval(this.idleTimer)
    if (this.mineTimer) clearTimeout(this.mineTimer)
    this.mineTimer = undefined
  }

  noteWrite(): void {
    this.lastWriteAt = Date.now()
  }

  /** A caller mined (evm_mine, anvil_mine): the next block keeps its distance from that one. */
  noteMined(): void {
    this.lastMineAt = Date.now()
  }

  setAutomine(on: boolean): void {
    this.automine = on
    if (on && this.node.pending.size) this.schedule()
  }

  /** Mines one block and journals it, on the serial queue. `fresh`: only to bring chain time up to date. */
  async mine(fresh = false): Promise<number> {
    const t = performance.now()
    await this.node.raw('evm_mine')
    const b = await this.node.afterMine()
    if (b.txs) await archiveBlocks(this.node, this.archive, this.node.blocks, this.node.blocks)
    if (fresh) this.journal.appendFresh(b.timestamp)
    else this.journal.append(journalCall('evm_mine', [b.timestamp]))
    const dt = performance.now() - t
    this.mineMs = 0.7 * this.mineMs + 0.3 * dt
    this.journal.tail.costMs += dt
    this.lastMineAt = Date.now()
    this.lastBlockTxs = b.txs
    return b.txs
  }

  /**
   * Between the slices of a long send: a block now (after what is queued already) when a full
   * one waits, so that no block, nor any call waiting behind one, grows with the send.
   */
  mineIfFull(): Promise<void> {
    // (beside a dump the slices go on too, and the block after it takes them)
    if (!this.full() || this.node.dumping) return Promise.resolve()
    return this.node.serial(async () => {
      if (this.full()) await this.mineQueued()
    })
  }

  private full(): boolean {
    const node = this.node
    return this.automine && !node.closed && !node.dead && node.pending.size >= FULL_BLOCK_TXS
  }

  /**
   * A block of what waits, on the serial queue; then, if the journal's tail passed its budget, a
   * snapshot queued after it. Not in this block's turn: a send queued behind the block would wait
   * for the whole snapshot (dump, a trim's cut and reload: ~150 ms at 1M records); from its own
   * turn, sends that come during its dump go beside it.
   */
  private async mineQueued(): Promise<number> {
    const n = await this.mine()
    if (this.tailOverBudget()) this.queueSnapshot(this.tailOverBudget)
    return n
  }

  /** Replaying the journal's tail would take the restart past its budget. */
  private readonly tailOverBudget = (): boolean => this.journal.tail.costMs > this.journal.tailBudgetMs()

  /** A snapshot on the serial queue, unless one is queued already; `still()` checked in its turn. */
  private queueSnapshot(still: () => boolean): void {
    if (this.snapshotQueued) return
    this.snapshotQueued = true
    this.node.dumpQueued()
    this.node
      .serial(async () => {
        try {
          if (!this.node.closed && !this.node.dead && still()) await this.snapshot()
        } finally {
          this.node.dumpBegun() // (no dump, or it failed before one)
        }
      })
      .catch((e: unknown) => this.opts.log('snapshot failed', { error: String(e) }, 'warn'))
      .finally(() => {
        this.snapshotQueued = false
      })
  }

  /**
   * On the serial queue. The receipts of every block mined so far are written first: a restart
   * replays none of them. After a trim, a block between every FULL_BLOCK_TXS of the pool's txs
   * sent again (unless the caller mines).
   */
  snapshot(): Promise<void> {
    this.archive.flush()
    return this.journal.snapshot(this.node, this.automine ? { txs: FULL_BLOCK_TXS, mine: () => this.mine() } : undefined)
  }

  /** Snapshots when the tail (grown by writes without mining, e.g. automine off) is well past its budget. */
  async snapshotIfLong(): Promise<void> {
    if (this.journal.tail.costMs > this.journal.tailBudgetMs() * 1.5) await this.snapshot()
  }

  // After a block of 0-2 txs (a caller waiting for each receipt, or an idle chain) the next tx
  // is mined after a short gap; after a bigger block (load) blocks come every blockTimeMs and
  // hold all waiting txs, unless FULL_BLOCK_TXS are waiting (see there): a block of thousands
  // would stall every send for a second. A block's own cost is ~3 ms (the ledger keeps two
  // slots), so smaller blocks cost little.
  schedule(): void {
    const node = this.node
    if (!this.automine || node.closed || node.dead) return
    const { blockTimeMs } = this.opts
    const full = this.full()
    if (this.mineTimer && !(full && this.mineDueAt - Date.now() > MIN_BLOCK_GAP_MS)) return
    clearTimeout(this.mineTimer)
    const gap = full ? MIN_BLOCK_GAP_MS : this.lastBlockTxs <= 2 ? Math.min(blockTimeMs, Math.max(MIN_BLOCK_GAP_MS, 2 * this.mineMs)) : blockTimeMs
    this.mineDueAt = Math.max(Date.now(), this.lastMineAt + gap)
    this.mineTimer = setTimeout(() => {
      this.mineTimer = undefined
      node
        .serial(async () => {
          if (node.closed || node.dead || !node.pending.size) return 0 // (a fresh block, or mineIfFull, may have taken them)
          return this.mineQueued()
        })
        .then(
          (n) => {
            if (n > 0 && node.pending.size > 0) this.schedule()
          },
          (e: unknown) => this.opts.log('mining failed', { error: String(e) }, 'warn'),
        )
    }, this.mineDueAt - Date.now())
  }

  private idleSnapshot(): void {
    const idle = (): boolean => Date.now() - this.lastWriteAt >= this.opts.idleSnapshotMs
    if (this.node.closed || this.snapshotQueued || !idle() || !this.journal.idleSnapshotWorthIt()) return
    this.queueSnapshot(idle)
  }

  // anvil runs a call against the newest block, whose timestamp stops while nothing is mined:
  // after 10 idle minutes an EIP-3009 authorization signed with validAfter = now - 600 is "not
  // yet valid" to every simulation. So such a read first mines an empty block when the newest
  // one is stale. Checked from memory (free under load, when blocks are fresh); concurrent
  // reads share one block; none is mined while nothing asks.
  private stale(): boolean {
    return Date.now() + this.journal.offset * 1000 - this.node.latestTs * 1000 > this.opts.freshBlockMs
  }

  /** Before a read at the newest block: a block at the current chain time, if it is due. */
  async freshenForRead(): Promise<void> {
    // (with automine off the caller mines: a block here would take its pending txs)
    if (this.automine && !this.node.nextBlockTimeSet && this.stale() && Date.now() - this.lastFreshAt >= this.opts.freshBlockMs) await this.freshen()
  }

  private freshen(): Promise<void> {
    const node = this.node
    this.freshening ??= node
      .serial(async () => {
        if (node.closed || node.dead || node.nextBlockTimeSet || !this.stale()) return // a block came while this waited
        this.lastFreshAt = Date.now()
        await this.mine(true)
        // still behind: the offset we hold is not anvil's (e.g. a block at a set timestamp moved it)
        if (this.stale()) await this.journal.recordOffset(node)
      })
      .catch((e: unknown) => this.opts.log('mining a block for chain time failed', { error: String(e) }, 'warn'))
      .finally(() => {
        this.freshening = null
      })
    return this.freshening
  }
}
