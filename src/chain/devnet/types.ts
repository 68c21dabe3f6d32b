export interface DevnetOptions {
  dataDir: string
  chainId: number
  host: string
  port: number
  /**
   * Spacing (ms) of blocks under load; default 250. After a block of at most 2 txs the next one
   * comes after max(10 ms, 2x the last mining time), so a caller that waits for each receipt is
   * not held 200 ms per tx.
   */
  blockTimeMs?: number
  /** `level`: what went wrong is `warn` (the chain carries on) or `error` (it cannot); else information. */
  log?: DevnetLog
  /** Path of the anvil binary (default: config chain.anvilPath, else the npm package). */
  anvilPath?: string
  /**
   * Snapshot when loading the last snapshot plus replaying the journal tail would take longer
   * than this (ms, estimated from the snapshot size and the tail's measured cost). Default 2000.
   */
  restartBudgetMs?: number
  /** Snapshot after this much idle time when the tail is worth replaying (ms). Default 2000. */
  idleSnapshotMs?: number
  /**
   * A read at the newest block's time mines an empty block first when that block is older than
   * this (ms of chain time). Default 2000.
   */
  freshBlockMs?: number
  /**
   * anvil keeps the txs and receipts of this many newest blocks (default 2, at least 2); older
   * receipts are answered from the receipt archive on disk. A state dump holds these blocks and
   * blocks wait while anvil dumps (about 0.03-0.06 ms per kept tx), so small keeps the dump
   * short and the same size however many records the chain holds.
   */
  keepBlocks?: number
  /**
   * At a snapshot, once this many blocks were mined since the last trim, anvil is reset and
   * loaded back with only its newest 256 block headers (older ones are served by no method;
   * their receipts stay in the archive). Default 512, at least 256. See trim.ts.
   */
  trimEveryBlocks?: number
  /** An IPC call anvil has not answered within this (ms) fails; a state dump gets 4x. Default 30000. */
  ipcTimeoutMs?: number
}

export type DevnetLog = (msg: string, fields?: object, level?: 'warn' | 'error') => void

/**
 * The embedded chain cannot answer: anvil exited, its IPC connection closed, or it left a call
 * unanswered past the timeout.
 */
export class DevnetUnavailableError extends Error {
  override readonly name = 'DevnetUnavailableError'
  /** EIP-1193 "disconnected": viem maps it to ProviderDisconnectedError, which it does not retry. */
  readonly code = 4900
  constructor(
    message: string,
    /** Anvil left the call unanswered past its deadline (it may still run it). */
    readonly timedOut = false,
  ) {
    super(message)
  }
}

export interface DevnetStats {
  blocks: number
  generation: number
  tailEntries: number
  replayed: number
  replayMs: number
  loadMs: number
  /** moving average of the time one block takes to mine */
  mineMs: number
  /** how long each of the last snapshots held blocks back (the dump; sends go on beside it) */
  snapshotMs: number[]
  /** snapshots taken since the start */
  snapshots: number
  /** anvil's CPU time (ms) during each of those holds (Linux; NaN elsewhere) */
  snapshotCpuMs: number[]
  /** snapshots that trimmed anvil's old block headers (see trim.ts) */
  trims: number
  /** sends answered while anvil dumped its state, instead of waiting for the dump */
  sentBesideDumps: number
  /** whether anvil is dumping its state now */
  dumping: boolean
}

export interface Devnet {
  rpcUrl: string
  chainId: number
  /** PID of the anvil process (the watchdog shell is its parent). */
  childPid: number
  request(args: { method: string; params?: unknown[] | object }): Promise<unknown>
  /**
   * `eth_sendRawTransaction` for several raw transactions of ONE sender (consecutive nonces),
   * in one round trip to anvil and one journal line. anvil may take them in any order: its pool
   * orders one sender's transactions by nonce, so the mined blocks come out the same, and so do
   * they when a journal replay sends the line again the same way. Per transaction: its hash or
   * the error.
   */
  sendRawTransactions(raws: string[]): Promise<SendResult[]>
  /** Ledger transactions of `from`, signed or unsigned (sent as that account impersonated): RpcFront.sendLedger. */
  sendLedger(from: string, raws: string[]): Promise<SendResult[]>
  /** The hash anvil gives an unsigned transaction of `from`, nothing kept (RpcFront.probeUnsigned). */
  probeUnsigned(from: string, raw: string): Promise<string>
  stats(): DevnetStats
  /** Takes a snapshot now (after what is queued); resolves once its files are written. */
  snapshot(): Promise<void>
  close(): Promise<void>
}

/** anvil's default dev accounts: 10 accounts of 10,000 ETH derived from this mnemonic. */
export const DEVNET_MNEMONIC = 'test test test test test test test test test test test junk'

export type RpcRequest = { jsonrpc?: string; id?: unknown; method?: unknown; params?: unknown }
export type RpcError = { code: number; message: string; data?: unknown }
export type RpcResponse = { jsonrpc: '2.0'; id: unknown; result?: unknown; error?: RpcError }
export type SendResult = { hash: string } | { error: RpcError }
