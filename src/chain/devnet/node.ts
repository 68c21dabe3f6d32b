import { IpcClient } from './ipc.js'
import { type DevnetLog, DevnetUnavailableError, type RpcResponse } from './types.js'

type Block = { number: string; timestamp: string; transactions: string[] }

/**
 * What this process knows of anvil's chain (the newest block, the txs it acknowledged but has not
 * mined yet), the queue every state change goes through, and whether anvil can still answer.
 */
export class AnvilNode {
  /** hash -> the journal line that sent it, for txs acknowledged but not yet mined */
  readonly pending = new Map<string, string>()
  blocks = 0
  /** the newest block's timestamp (s) */
  latestTs = 0
  /** the caller set the next block's timestamp: no block for chain time may take it */
  nextBlockTimeSet = false
  /** no dev method whose effect lives outside anvil's dump was used (see trim.ts) */
  trimmable = true
  /** anvil exited or stalled under us */
  dead: DevnetUnavailableError | null = null
  closed = false
  private minedWaiters: Array<() => void> = []
  private tail: Promise<unknown> = Promise.resolve()
  /** while anvil dumps its state: the queue of the sends let through beside the dump */
  private side: Promise<unknown> | null = null
  /** a snapshot queued and not yet dumping: sends wait for its dump to begin (see `send`) */
  private dumpDue: { begun: Promise<void>; begin: () => void } | null = null
  /** sends that went beside a dump instead of waiting for it */
  sentBesideDumps = 0
  /**
   * While a trim resets anvil and loads the cut state back (trim.ts): reads wait for it, since
   * between the two anvil answers for an empty chain (no contracts, no balances).
   */
  reloading: Promise<void> | null = null
  /** reads sent and not yet answered */
  private readonly readsInFlight = new Set<Promise<RpcResponse>>()

  /** accounts this process impersonated in anvil (to send as them: RpcFront.sendLedger) */
  private readonly impersonated = new Set<string>()

  /** a connection of its own for state dumps: the main one carries the sends that go on beside a dump */
  private dumpIpc: Promise<IpcClient> | null = null

  constructor(
    readonly ipc: IpcClient,
    private readonly log: DevnetLog,
    private readonly ipcPath?: string,
    private readonly ipcTimeoutMs = 30_000,
  ) {}

  /** anvil_dumpState, on a connection of its own, so sends on the main one are answered meanwhile. */
  async dumpState(ms: number): Promise<string> {
    if (!this.ipcPath) return (await this.raw('anvil_dumpState', [], ms)) as string
    this.dumpIpc ??= IpcClient.connect(this.ipcPath, this.ipcTimeoutMs)
    const conn = this.dumpIpc
    try {
      const r = await (await conn).call('anvil_dumpState', '[]', ms)
      if (r.error) throw new Error(`anvil_dumpState: ${r.error.message}`)
      return r.result as string
    } catch (e) {
      // a connection that failed or closed is opened again for the next dump (a timeout stops the chain: see watch)
      if (!(e instanceof DevnetUnavailableError && e.timedOut) && this.dumpIpc === conn) {
        this.dumpIpc = null
        void conn.then(
          (c) => c.close(),
          () => {},
        )
      }
      throw e
    }
  }

  /**
   * A read: sent once no trim is reloading anvil. Checked right before the write, with no await
   * between: a read sent after a trim's reset would see an empty chain.
   */
  async read(method: string, paramsJson: string): Promise<RpcResponse> {
    while (this.reloading) await this.reloading
    const p = this.ipc.call(method, paramsJson)
    const done = (): void => {
      this.readsInFlight.delete(p)
    }
    this.readsInFlight.add(p)
    p.then(done, done)
    return p
  }

  /** Once the reads already sent are answered: anvil runs a connection's calls concurrently, so one sent before a reset may run after it. */
  async readsAnswered(): Promise<void> {
    await Promise.allSettled([...this.readsInFlight])
  }

  /** A call whose error is thrown. */
  async raw(method: string, params: unknown[] = [], ms?: number): Promise<unknown> {
    const r = await this.ipc.call(method, JSON.stringify(params), ms)
    if (r.error) throw Object.assign(new Error(`${method}: ${r.error.message}`), { code: r.error.code })
    return r.result
  }

  /**
   * Lets `account` send without a signature (anvil_impersonateAccount, unjournalled: its sends
   * are journalled with the account, and a replay impersonates it again).
   */
  async impersonate(account: string): Promise<void> {
    const a = account.toLowerCase()
    if (this.impersonated.has(a)) return
    await this.raw('anvil_impersonateAccount', [account])
    this.impersonated.add(a)
  }

  /** anvil may no longer impersonate what it did (a reset, a caller's impersonation call): asked again at the next send. */
  forgetImpersonated(): void {
    this.impersonated.clear()
  }

  /** Runs `fn` after everything queued before it: the one queue for what changes chain state. */
  serial<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.watch(this.tail.then(fn, fn))
    this.tail = p.catch(() => {})
    return p
  }

  /** Whether anvil is dumping its state (sends go beside it). */
  get dumping(): boolean {
    return this.side !== null
  }

  /**
   * A send: under --no-mining it only fills anvil's pool, which a state dump does not hold, so
   * while a dump runs it goes beside it instead of waiting (`beside`: it did); else on the
   * serial queue. Sends beside a dump are serial among themselves, so the journal keeps the
   * order anvil took them in.
   */
  send<T>(fn: (beside: boolean) => Promise<T>): Promise<T> {
    if (!this.side && this.dumpDue) return this.dumpDue.begun.then(() => this.send(fn))
    if (!this.side) return this.serial(() => fn(false))
    this.sentBesideDumps++
    const run = (): Promise<T> => fn(true)
    const p = this.watch(this.side.then(run, run))
    this.side = p.catch(() => {})
    return p
  }

  /**
   * On the serial queue: runs `dump` with sends let through beside it (see `send`), and
   * resolves once those sends are answered too, so what comes next on the queue (a block)
   * comes after them, as in the journal.
   */
  async beside<T>(dump: () => Promise<T>): Promise<T> {
    this.side = Promise.resolve()
    this.dumpBegun()
    try {
      return await dump()
    } finally {
      const sends = this.side
      this.side = null
      await sends
    }
  }

  /**
   * A snapshot was queued on the serial queue: until its dump begins (`beside`), or its turn ends
   * without one (`dumpBegun`), sends wait and then go beside the dump. Queued behind the
   * snapshot's turn, a send waited for all of it (at a trim: the dump, the cut, anvil's reload
   * and the pool sent again; 231 ms at 1M records).
   */
  dumpQueued(): void {
    if (this.dumpDue) return
    let begin!: () => void
    const begun = new Promise<void>((r) => {
      begin = r
    })
    this.dumpDue = { begun, begin }
  }

  /** The queued snapshot's dump began, or its turn came without one: the sends waiting for it go. */
  dumpBegun(): void {
    const due = this.dumpDue
    this.dumpDue = null
    due?.begin()
  }

  private watch<T>(p: Promise<T>): Promise<T> {
    return p.catch((e: unknown) => {
      // A state change anvil left unanswered may still run when anvil wakes, unjournalled: the
      // chain and its journal could differ from then on, so nothing more is sent to it.
      if (e instanceof DevnetUnavailableError && e.timedOut && !this.dead) {
        this.fail(new DevnetUnavailableError(`embedded chain: anvil stalled on a state change (${e.message}); restart Paygate`))
        this.log('anvil stalled on a state change; the embedded chain refuses every call until Paygate restarts', { error: e.message }, 'error')
      }
      throw e
    })
  }

  /** Closes the dump connection (the main one is the child's to close). */
  closeDumpIpc(): void {
    void this.dumpIpc?.then(
      (c) => c.close(),
      () => {},
    )
    this.dumpIpc = null
  }

  /** From now on every call fails with `e`. */
  fail(e: DevnetUnavailableError): void {
    this.dead = e
    this.ipc.fail(e, true)
  }

  /**
   * Puts the chain-time offset back after a reload or a replay moved it: forward with
   * evm_increaseTime, back by setting the time (anvil cannot increase by a negative amount).
   */
  async setTimeOffset(offset: number): Promise<void> {
    const cur = Number(await this.raw('evm_increaseTime', [0]))
    if (offset > cur) await this.raw('evm_increaseTime', [offset - cur])
    else if (offset < cur) await this.raw('anvil_setTime', [Math.floor(Date.now() / 1000) + offset])
  }

  /** Forget pending txs that are mined (or gone), asking the node for each. */
  async dropMined(): Promise<void> {
    for (const h of [...this.pending.keys()]) {
      const tx = (await this.raw('eth_getTransactionByHash', [h])) as { blockNumber?: string | null } | null
      if (!tx || tx.blockNumber) this.pending.delete(h)
    }
  }

  /** The newest block; what it mined is no longer pending. */
  async latestMined(): Promise<Block> {
    const b = (await this.raw('eth_getBlockByNumber', ['latest', false])) as Block
    for (const h of b.transactions) this.pending.delete(h.toLowerCase())
    this.latestTs = Number(b.timestamp)
    return b
  }

  /** After anvil mined one block or more: catch up, and wake who waits for a block. */
  async afterMine(): Promise<{ timestamp: number; txs: number }> {
    const b = await this.latestMined()
    const n = Number(b.number)
    // several blocks (anvil_mine): the earlier blocks' txs are found by asking
    if (n - this.blocks > 1) await this.dropMined()
    this.blocks = n
    this.nextBlockTimeSet = false
    const w = this.minedWaiters
    this.minedWaiters = []
    for (const f of w) f()
    return { timestamp: Number(b.timestamp), txs: b.transactions.length }
  }

  /** Resolves at the next block, or at `until` (ms since the epoch). */
  nextBlock(until: number): Promise<void> {
    return new Promise<void>((r) => {
      this.minedWaiters.push(r)
      setTimeout(r, Math.max(1, until - Date.now()))
    })
  }

  /** Lets every waiter go (closing, or anvil gone). */
  wakeAll(): void {
    for (const f of this.minedWaiters) f()
  }
}
