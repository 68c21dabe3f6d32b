import { Worker } from 'node:worker_threads'
import type { AnvilNode } from './node.js'

// Why (issue 28, docs/devnet.md "At scale"): anvil keeps every block header it ever mined and
// puts all of them in every state dump: ~1.7 KB of dump and ~0.025 ms of anvil CPU a header,
// so at a million records (thousands of blocks) each snapshot held blocks back longer, and
// anvil's memory grew with them. At a snapshot, once enough blocks piled up, anvil is reset
// and loaded back from that same dump with only the newest headers: state, kept txs and the
// newest block (same hash) come back, older headers are gone (their receipts stay in the
// receipt archive). The trimmed dump is the snapshot written, so a restart starts from exactly
// what the live chain holds.

/** Headers kept by a trim: BLOCKHASH reaches the newest 256 blocks. */
export const TRIM_KEEP_HEADERS = 256
/**
 * Default: a trim is due once this many blocks were mined since the last. Between trims anvil
 * also holds ~0.85 KB per mined tx that its tx keeper emptied but never freed (512 blocks of
 * 250 txs: ~110 MB); a trim costs anvil a reset and a load of a small state (tens of ms).
 */
export const TRIM_EVERY_BLOCKS = 512

/**
 * Dev methods whose effect lives in anvil outside its dump (impersonation, evm_snapshot ids,
 * gas and fee settings): once one was used, this process never trims, so
 * the chain keeps behaving as the caller set it. Sends, blocks and time are fine (no trim while a
 * set next timestamp waits for its block).
 */
export const trimSafe = (method: string): boolean =>
  /^(eth_sendRawTransaction|eth_sendTransaction|evm_mine|anvil_mine|hardhat_mine|evm_increaseTime|anvil_increaseTime|evm_setNextBlockTimestamp|anvil_setNextBlockTimestamp)$/.test(method)

/** A dump cut to its newest TRIM_KEEP_HEADERS headers: the JSON (the snapshot to write) and the packed form anvil loads. */
export interface CutDump {
  json: Buffer
  gz: Buffer
  /** how long the cut took (ms) */
  ms: number
}

// The cut parses and writes a few MB of JSON: on Paygate's thread that held its event loop (paid
// calls, and the sends that go on beside the cut) for tens of ms at each trim, so it runs on a
// thread of its own. Plain JavaScript, so it runs alike built and from source. Packed at gzip's
// fastest level: only anvil unpacks it (the snapshot file is packed on its own).
const CUT_THREAD = `
const { parentPort } = require('node:worker_threads')
const zlib = require('node:zlib')
parentPort.once('message', ({ state, keep }) => {
  const dump = JSON.parse(zlib.gunzipSync(Buffer.from(state.slice(2), 'hex')).toString('utf8'))
  dump.blocks = dump.blocks.sort((a, b) => Number(a.header.number) - Number(b.header.number)).slice(-keep)
  const json = Buffer.from(JSON.stringify(dump))
  parentPort.postMessage({ json, gz: zlib.gzipSync(json, { level: 1 }) })
  parentPort.close()
})
`

/**
 * A thread that cuts one dump (anvil's: hex of gzipped JSON) to its newest TRIM_KEEP_HEADERS
 * headers. Start it before the dump, so its start-up (~40 ms) goes on beside the dump; `close`
 * it when done either way.
 */
export class HeaderCut {
  private readonly thread = new Worker(CUT_THREAD, { eval: true })
  private readonly done: Promise<{ json: Uint8Array; gz: Uint8Array }>

  constructor() {
    this.done = new Promise((resolve, reject) => {
      this.thread.once('message', resolve)
      this.thread.once('error', reject)
      this.thread.once('exit', (code) => reject(new Error(`embedded chain: the header cut's thread exited (${code}) without a result`)))
    })
    this.done.catch(() => {}) // (read by cut(); one never asked for must not be an unhandled rejection)
  }

  async cut(state: string): Promise<CutDump> {
    const t = performance.now()
    this.thread.postMessage({ state, keep: TRIM_KEEP_HEADERS })
    const { json, gz } = await this.done
    return { json: Buffer.from(json.buffer, json.byteOffset, json.byteLength), gz: Buffer.from(gz.buffer, gz.byteOffset, gz.byteLength), ms: Math.round(performance.now() - t) }
  }

  close(): void {
    void this.thread.terminate()
  }
}

/**
 * On the serial queue, with no block mined since `cut` was dumped: resets anvil and loads the cut
 * dump; puts back the chain-time offset and the next base fee, which the reset loses (the pool's
 * txs go back with `resendPool`). Throws if the newest block is not the same afterwards: the
 * caller must stop the chain then. Resolves how long anvil took (ms).
 */
export async function trimAnvil(node: AnvilNode, cut: CutDump, offset: number): Promise<number> {
  const t = performance.now()
  const latest = (await node.raw('eth_getBlockByNumber', ['latest', false])) as { hash: string }
  const { environment } = (await node.raw('anvil_nodeInfo')) as { environment: { baseFee: string | number } }
  // Reads wait until the state is back (a read between the reset and the load would see an
  // empty chain), and the reset waits for the reads already sent (anvil may run one after it).
  let reloaded!: () => void
  node.reloading = new Promise<void>((r) => {
    reloaded = r
  })
  try {
    await node.readsAnswered()
    await node.raw('anvil_reset', [])
    await node.raw('anvil_loadState', [`0x${cut.gz.toString('hex')}`])
    await node.raw('anvil_setNextBlockBaseFeePerGas', [`0x${BigInt(environment.baseFee).toString(16)}`])
    await node.setTimeOffset(offset)
  } finally {
    node.reloading = null
    reloaded()
  }
  const now = (await node.raw('eth_getBlockByNumber', ['latest', false])) as { hash: string }
  if (now.hash !== latest.hash) throw new Error(`embedded chain: after trimming old headers the newest block is ${now.hash}, not ${latest.hash}`)
  return Math.round(performance.now() - t)
}

/** A journal line: anvil's pool was emptied here (a trim's reset); a replay empties it too. */
export const POOL_RESET_LINE = '{"pool":"reset"}'

/** Blocks mined while the pool is sent again: one after every `txs` sent. */
export interface BlocksBetween {
  txs: number
  mine: () => Promise<unknown>
}

/** Txs sent again together: one sender's (impersonated: `as`) run, or a single tx. */
export interface ResentRun {
  m: string
  /** each call's params, as JSON */
  ps: string[]
  as?: string
}

/**
 * After a trim's reset emptied anvil's pool: its txs (`lines`, as journalled when first sent) go
 * back in the order they were sent, each run journalled before it is sent. One impersonated
 * sender's consecutive txs go pipelined (anvil orders one sender's txs by nonce, as for a
 * ledger run: RpcFront.sendRun); others one at a time (anvil may take a pipelined run in any
 * order, and senders differ). With `blocks`, a block after every `blocks.txs` of them: the
 * sends that went on beside the dump and its cut can number hundreds, and one block of them all
 * held every send behind it for as long as anvil took to build its receipts (their cost grows
 * with the square of the block: miner.ts). Resolves how many went back. If anvil refuses one,
 * or a block fails, the ones not yet journalled are journalled before it throws (the chain
 * stops then): the restart replays them, so none that was acknowledged is lost.
 */
export async function resendPool(node: AnvilNode, lines: string[], journal: (run: ResentRun) => void, blocks?: BlocksBetween): Promise<number> {
  node.forgetImpersonated()
  const calls = lines.map((l) => JSON.parse(l) as { m: string; p: unknown[]; as?: string })
  const every = blocks?.txs ?? Number.POSITIVE_INFINITY
  let sent = 0
  let journalled = 0
  try {
    while (sent < calls.length) {
      const { m, as } = calls[sent]!
      let end = sent + 1
      const room = Math.min(calls.length, sent + every - (sent % every))
      if (as) while (end < room && calls[end]!.m === m && calls[end]!.as === as) end++
      const run: ResentRun = { m, ps: calls.slice(sent, end).map((c) => JSON.stringify(c.p)), as }
      if (as) await node.impersonate(as)
      journal(run)
      journalled = end
      const rs = run.ps.length === 1 ? [await node.ipc.call(m, run.ps[0]!)] : await node.ipc.callMany(m, run.ps)
      const refused = rs.find((r) => r.error)
      if (refused) throw new Error(`embedded chain: a pending tx was refused after trimming old headers: ${refused.error!.message}`)
      sent = end
      if (sent % every === 0 && sent < calls.length) await blocks!.mine()
    }
  } catch (e) {
    for (const { m, p, as } of calls.slice(journalled)) journal({ m, ps: [JSON.stringify(p)], as })
    throw e
  }
  return sent
}
