import type { Worker } from 'node:worker_threads'
import type { FastSigner } from '../crypto/secp256k1.js'
import { moduleThread } from '../util/thread.js'
import type { LedgerEntry } from './ledger-tx.js'
import type { LedgerSignContext, SignedLedgerTx } from './ledger-signer.js'

/**
 * The ledger records' signatures on a thread of their own. Under load the gateway's main
 * thread is what bounds its paid calls a second (docs/benchmarks.md), and a record's signature
 * (RLP, two keccaks and a secp256k1 signature, ~0.08 ms) needs nothing from it: the outbox
 * sends each group of records here and stores them when their bytes come back.
 *
 * Requests are answered in order. If the thread fails or exits, what waits is rejected and
 * `alive` turns false: the writer then signs on the main thread.
 */
export class LedgerSignThread {
  private readonly thread: Worker
  private next = 0
  private readonly waiting = new Map<number, { resolve: (s: SignedLedgerTx[]) => void; reject: (e: Error) => void }>()
  alive = true

  constructor(key: FastSigner) {
    this.thread = moduleThread(import.meta.url, 'ledger-sign-worker', { workerData: { key: key.exportKey() } })
    // Idle, it must not keep the process up; while a request waits it does.
    this.thread.unref()
    this.thread.on('message', (m: { id: number; signed?: SignedLedgerTx[]; error?: string }) => {
      const w = this.waiting.get(m.id)
      if (!w) return
      this.waiting.delete(m.id)
      if (!this.waiting.size && this.alive) this.thread.unref()
      if (m.signed) w.resolve(m.signed)
      else w.reject(new Error(m.error))
    })
    this.thread.on('error', (e) => this.fail(e))
    this.thread.on('exit', (code) => this.fail(new Error(`the ledger signing thread exited (${code})`)))
  }

  sign(ctx: LedgerSignContext, items: readonly { entry: LedgerEntry; nonce: bigint }[]): Promise<SignedLedgerTx[]> {
    if (!this.alive) return Promise.reject(new Error('the ledger signing thread is stopped'))
    const id = this.next++
    return new Promise((resolve, reject) => {
      if (!this.waiting.size) this.thread.ref()
      this.waiting.set(id, { resolve, reject })
      this.thread.postMessage({ id, ctx, items })
    })
  }

  /**
   * Stop once what was asked is answered. Never `terminate()`: the native signer and keccak
   * abort the whole process when a thread is cut off inside them. (Likewise the process should
   * not `exit()` while a request waits; the gateway closes its outbox, and with it this, first.)
   */
  async close(): Promise<void> {
    if (!this.alive) return
    this.alive = false
    const exited = new Promise((r) => this.thread.once('exit', r))
    this.thread.ref()
    this.thread.postMessage({ stop: true })
    await exited
  }

  private fail(e: Error): void {
    this.alive = false
    for (const w of this.waiting.values()) w.reject(e)
    this.waiting.clear()
  }
}
