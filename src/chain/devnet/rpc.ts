import { archiveBlocks, type ReceiptArchive } from './archive.js'
import { type Journal, journalCall, journalLine, journalRun } from './journal.js'
import { AUTOMINE_QUERIES, AUTOMINE_SETTERS, isReadOnly, MINES, REFUSED, readsNewestBlock, reply, rpcError, SENDS, SET_NEXT_TIME } from './methods.js'
import { FULL_BLOCK_TXS, type Miner } from './miner.js'
import { eip1559Items, signedItems } from '../eip1559.js'
import { addressBytes, unsignedHash } from '../ledger-signer.js'
import type { AnvilNode } from './node.js'
import { trimSafe } from './trim.js'
import type { RpcRequest, RpcResponse, SendResult } from './types.js'

/**
 * The JSON-RPC front: reads go straight to anvil (once a trim's reload is over: AnvilNode.read);
 * every state change goes through the serial queue (sends go beside a state dump) and is
 * journalled before it is answered. Dev methods that would take the chain from under the
 * journal (reset, dump/load, interval mining) are refused.
 */
export class RpcFront {
  constructor(
    private readonly node: AnvilNode,
    private readonly journal: Journal,
    private readonly miner: Miner,
    private readonly archive: ReceiptArchive,
    private readonly blockTimeMs: number,
  ) {}

  async handle(req: RpcRequest): Promise<RpcResponse> {
    const id = req?.id ?? null
    if (!req || typeof req.method !== 'string') return rpcError(id, -32600, 'invalid request')
    const method = req.method
    const params: unknown[] = Array.isArray(req.params) ? req.params : req.params === undefined || req.params === null ? [] : [req.params]
    const node = this.node
    if (node.closed) return rpcError(id, -32000, 'embedded chain is closed')
    if (node.dead) throw node.dead
    if (REFUSED.has(method)) return rpcError(id, -32601, `${method} is not available on the Paygate embedded chain`)
    if (AUTOMINE_QUERIES.has(method)) return { jsonrpc: '2.0', id, result: this.miner.automine }
    if (AUTOMINE_SETTERS.has(method)) {
      this.miner.setAutomine(params[0] === true)
      return { jsonrpc: '2.0', id, result: null }
    }
    if (method === 'eth_getTransactionReceipt') return this.receipt(id, params)
    if (method === 'eth_getBlockReceipts') return this.blockReceipts(id, params)
    if (isReadOnly(method)) {
      if (readsNewestBlock(method, params)) await this.miner.freshenForRead()
      return reply(id, await node.read(method, JSON.stringify(params)))
    }
    this.miner.noteWrite()
    if (SENDS.has(method)) return node.send((beside) => this.write(id, method, params, beside))
    return node.serial(() => this.write(id, method, params, false))
  }

  /**
   * A tx we are about to mine is waited for. A recent one is answered from the archive's memory
   * (what anvil gave when its block was mined), so that anvil does not build the receipts of
   * a block again for each caller that confirms payments; one whose block anvil forgot comes
   * from the archive's files.
   */
  private async receipt(id: unknown, params: unknown[]): Promise<RpcResponse> {
    await this.untilMined(params[0])
    const kept = typeof params[0] === 'string' ? this.archive.recentReceipt(params[0]) : undefined
    if (kept !== undefined) return { jsonrpc: '2.0', id, result: kept }
    const r = await this.node.read('eth_getTransactionReceipt', JSON.stringify(params))
    if (r.error || r.result !== null || typeof params[0] !== 'string') return reply(id, r)
    return { jsonrpc: '2.0', id, result: this.archive.find(params[0]) }
  }

  /** A recent block's receipts come from the archive's memory (as receipt() says); an older one from anvil. */
  private async blockReceipts(id: unknown, params: unknown[]): Promise<RpcResponse> {
    const tag = params[0]
    const n = typeof tag === 'string' && /^0x[0-9a-f]+$/i.test(tag) ? Number(tag) : null
    const kept = n === null ? null : this.archive.blockReceipts(n)
    if (kept) return { jsonrpc: '2.0', id, result: kept }
    return reply(id, await this.node.read('eth_getBlockReceipts', JSON.stringify(params)))
  }

  /** A tx we are about to mine: wait for its block instead of answering null. */
  private async untilMined(hash: unknown): Promise<void> {
    const node = this.node
    const h = typeof hash === 'string' ? hash.toLowerCase() : ''
    const until = Date.now() + 2 * this.blockTimeMs + 1000
    while (node.pending.has(h) && this.miner.automine && !node.closed && !node.dead && Date.now() < until) await node.nextBlock(until)
  }

  /** A state change, on the serial queue (a send may go `beside` a state dump instead). */
  private async write(id: unknown, method: string, params: unknown[], beside: boolean): Promise<RpcResponse> {
    const { node, journal } = this
    if (node.closed) return rpcError(id, -32000, 'embedded chain is closed')
    const t = performance.now()
    if (!trimSafe(method)) node.trimmable = false
    const r = await node.ipc.call(method, JSON.stringify(params))
    // (a caller's impersonation calls may undo Paygate's: its sends impersonate again)
    if (/impersonat/i.test(method)) node.forgetImpersonated()
    if (r.error) return reply(id, r)
    if (MINES.has(method)) await this.mined()
    else {
      const line = journalCall(method, params)
      journal.append(line)
      if (SENDS.has(method) && typeof r.result === 'string') {
        node.pending.set(r.result.toLowerCase(), line)
        this.miner.schedule()
      } else if (/time|revert/i.test(method)) {
        if (SET_NEXT_TIME.test(method)) node.nextBlockTimeSet = true
        await journal.recordOffset(node)
        // a revert goes back to an older block
        if (/revert/i.test(method)) node.latestTs = Number(((await node.raw('eth_getBlockByNumber', ['latest', false])) as { timestamp: string }).timestamp)
      }
    }
    journal.tail.costMs += performance.now() - t
    if (!beside) await this.miner.snapshotIfLong()
    return reply(id, r)
  }

  /**
   * After the caller's evm_mine / anvil_mine: journalled as the blocks it mined, each with the
   * timestamp anvil gave it (replayed one evm_mine at a time). anvil gives each block of an
   * anvil_mine the chain time it is mined at, in whole seconds: a replay of the call itself,
   * mined at another moment, crosses a second at another block (or none) and gets other
   * timestamps, and other hashes from there on.
   */
  private async mined(): Promise<void> {
    const { node, journal } = this
    const before = node.blocks
    const b = await node.afterMine()
    await archiveBlocks(node, this.archive, before + 1, node.blocks)
    const n = node.blocks - before
    if (n === 1) journal.append(journalCall('evm_mine', [b.timestamp]))
    else if (n > 1) {
      const times = await blockTimes(node, before + 1, node.blocks)
      const calls = times.map((ts) => `[${ts}]`)
      journal.append(journalRun('evm_mine', calls), n)
    }
    await journal.recordOffset(node)
    this.miner.noteMined()
  }

  /**
   * Sends in slices of a block's worth, with a block mined between them once a full one waits
   * (`Miner.mineIfFull`): a send of a thousand would otherwise make one block of a thousand,
   * whose receipts alone hold anvil for a third of a second.
   */
  async sendRawTransactions(raws: string[]): Promise<SendResult[]> {
    return this.sendSliced({ method: 'eth_sendRawTransaction', params: raws.map((r) => JSON.stringify([r])) })
  }

  /**
   * Ledger transactions of ONE account (consecutive nonces), each run of one kind in turn: signed
   * ones as sendRawTransactions; unsigned ones (EIP-1559 bytes with a zero signature:
   * LedgerSigner.unsigned) sent as that account impersonated (eth_sendTransaction), which anvil
   * takes without recovering a sender from a signature, the dearest part of taking a signed one
   * (docs/devnet.md). Journalled with the account, which a replay impersonates again. An
   * unsigned one that anvil hashes otherwise than Paygate did is answered as an error: the
   * hash stored with its payment would never find its receipt.
   */
  async sendLedger(from: string, raws: string[]): Promise<SendResult[]> {
    const sender = addressBytes(from)
    const txs = raws.map((raw) => {
      const bytes = Buffer.from(raw.replace(/^0x/, ''), 'hex')
      const items = eip1559Items(bytes)
      return signedItems(items) ? { raw } : { raw, request: sendRequest(from, items), hash: unsignedHash(bytes, sender) }
    })
    const out: SendResult[] = []
    for (let i = 0; i < txs.length; ) {
      const unsigned = txs[i]!.request !== undefined
      let j = i + 1
      while (j < txs.length && (txs[j]!.request !== undefined) === unsigned) j++
      const run = txs.slice(i, j)
      if (!unsigned) out.push(...(await this.sendRawTransactions(run.map((t) => t.raw))))
      else {
        const rs = await this.sendSliced({ method: 'eth_sendTransaction', params: run.map((t) => t.request!), as: from })
        out.push(
          ...rs.map((r, k): SendResult => ('hash' in r && r.hash.toLowerCase() !== run[k]!.hash ? { error: { code: -32603, message: `the chain gave the hash ${r.hash}, not ${run[k]!.hash}` } } : r)),
        )
      }
      i = j
    }
    return out
  }

  /**
   * The hash anvil gives an unsigned transaction sent as `from`, with nothing kept: sent to the
   * pool and dropped from it in one turn of the serial queue (no block between), neither
   * journalled nor mined. It must be under the account's next nonce: anvil drops only a tx
   * that could go in the next block.
   */
  probeUnsigned(from: string, raw: string): Promise<string> {
    const node = this.node
    return node.serial(async () => {
      await node.impersonate(from)
      const items = eip1559Items(Buffer.from(raw.replace(/^0x/, ''), 'hex'))
      const hash = (await node.raw('eth_sendTransaction', JSON.parse(sendRequest(from, items)) as unknown[])) as string
      if ((await node.raw('anvil_dropTransaction', [hash])) === null) throw new Error(`the probe ${hash} could not be dropped from the pool`)
      return hash
    })
  }

  private async sendSliced(kind: SendKind): Promise<SendResult[]> {
    const room = (): number => Math.max(1, FULL_BLOCK_TXS - this.node.pending.size)
    if (kind.params.length <= room()) return this.sendRun(kind)
    const out: SendResult[] = []
    for (let i = 0; i < kind.params.length; ) {
      if (i) await this.miner.mineIfFull()
      const slice = kind.params.slice(i, i + room())
      out.push(...(await this.sendRun({ ...kind, params: slice })))
      i += slice.length
    }
    return out
  }

  private sendRun({ method, params, as }: SendKind): Promise<SendResult[]> {
    if (!params.length) return Promise.resolve([])
    this.miner.noteWrite()
    const { node, journal } = this
    return node.send(async (beside) => {
      if (node.closed) throw new Error('embedded chain is closed')
      if (node.dead) throw node.dead
      const t = performance.now()
      if (as) await node.impersonate(as)
      const rs = await node.ipc.callMany(method, params)
      const sent: string[] = []
      const out = rs.map((r, i): SendResult => {
        if (r.error || typeof r.result !== 'string') return { error: r.error ?? { code: -32603, message: 'no transaction hash' } }
        sent.push(params[i]!)
        // a tx carried into the next journal at a snapshot goes there as a line of its own
        node.pending.set(r.result.toLowerCase(), journalLine(method, params[i]!, as))
        return { hash: r.result }
      })
      if (sent.length) {
        // one line for the run, so a replay can pipeline it too (the accepted ones, in order)
        journal.append(journalRun(method, sent, as), sent.length)
        this.miner.schedule()
      }
      journal.tail.costMs += performance.now() - t
      if (!beside) await this.miner.snapshotIfLong()
      return out
    })
  }

  /** For viem's custom() transport in process: the result, or the error thrown. */
  async request(a: { method: string; params?: unknown[] | object }): Promise<unknown> {
    const r = await this.handle({ jsonrpc: '2.0', id: 1, method: a.method, params: a.params })
    if (r.error) throw Object.assign(new Error(r.error.message), { code: r.error.code, data: r.error.data })
    return r.result
  }
}

/** A run of sends: the method, each call's params as JSON, and the account impersonated to send them (if any). */
interface SendKind {
  method: string
  params: string[]
  as?: string
}

/** The timestamps (s) of blocks `from` to `to`, read pipelined, a slice at a time. */
async function blockTimes(node: AnvilNode, from: number, to: number): Promise<number[]> {
  const out: number[] = []
  for (let lo = from; lo <= to; lo += 256) {
    const ps = Array.from({ length: Math.min(256, to - lo + 1) }, (_, i) => `["0x${(lo + i).toString(16)}",false]`)
    for (const r of await node.ipc.callMany('eth_getBlockByNumber', ps)) {
      if (r.error || !r.result) throw new Error(`eth_getBlockByNumber: ${r.error?.message ?? 'no block'}`)
      out.push(Number((r.result as { timestamp: string }).timestamp))
    }
  }
  return out
}

/** A JSON-RPC quantity from RLP's minimal big-endian bytes (none for zero). */
function quantity(b: Uint8Array): string {
  const hex = Buffer.from(b).toString('hex')
  return hex ? `0x${hex[0] === '0' ? hex.slice(1) : hex}` : '0x0'
}

/** eth_sendTransaction's params for a type 2 transaction (its items: eip1559Items) from `from` (impersonated). */
function sendRequest(from: string, items: readonly Uint8Array[]): string {
  const it = (i: number): Uint8Array => items[i]!
  const data = (b: Uint8Array): string => `0x${Buffer.from(b).toString('hex')}`
  return `[{"type":"0x2","chainId":"${quantity(it(0))}","from":${JSON.stringify(from)},"to":"${data(it(5))}","nonce":"${quantity(it(1))}","maxPriorityFeePerGas":"${quantity(it(2))}","maxFeePerGas":"${quantity(it(3))}","gas":"${quantity(it(4))}","value":"${quantity(it(6))}","data":"${data(it(7))}","accessList":[]}]`
}
