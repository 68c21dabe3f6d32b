import type { Worker } from 'node:worker_threads'
import type { FastSigner } from '../crypto/secp256k1.js'
import { GATE_SLOTS, GATE_STATE, GATE_STOP, SIGNING } from './ledger-sign-gate.js'
import { moduleThread } from '../util/thread.js'
import type { LedgerEntry } from './ledger-tx.js'
import type { LedgerSignContext, LedgerTx } from './ledger-signer.js'

/** The longest an exit waits for a signature under way (one takes ~0.08 ms). */
const EXIT_WAIT_MS = 1000

/** The gates of the live threads; one exit hook for all of them. */
const gates = new Set<Int32Array>()
let hooked = false

/**
 * On process exit, before Node stops the threads: a thread cut off inside the native secp256k1
 * or keccak addon aborts the whole process (SIGABRT, `Napi::Error`) instead of exiting with the
 * code asked for. Each thread is told to stop signing, and the exit waits until none is inside
 * a signature (the thread checks before each one, so that is at most one signature's time).
 */
function waitOutSignatures(): void {
  for (const g of gates) Atomics.store(g, GATE_STOP, 1)
  const until = Date.now() + EXIT_WAIT_MS
  for (const g of gates) {
    while (Atomics.load(g, GATE_STATE) === SIGNING) {
      const left = until - Date.now()
      if (left <= 0) return
      Atomics.wait(g, GATE_STATE, SIGNING, left)
    }
  }
}

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
  private readonly waiting = new Map<number, { resolve: (s: LedgerTx[]) => void; reject: (e: Error) => void }>()
  alive = true

  private readonly gate = new Int32Array(new SharedArrayBuffer(GATE_SLOTS * Int32Array.BYTES_PER_ELEMENT))

  constructor(key: FastSigner) {
    this.thread = moduleThread(import.meta.url, 'ledger-sign-worker', { workerData: { key: key.exportKey(), gate: this.gate.buffer } })
    gates.add(this.gate)
    if (!hooked) {
      process.on('exit', waitOutSignatures)
      hooked = true
    }
    // Idle, it must not keep the process up; while a request waits it does.
    this.thread.unref()
    this.thread.on('message', (m: { id: number; signed?: LedgerTx[]; error?: string }) => {
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

  sign(ctx: LedgerSignContext, items: readonly { entry: LedgerEntry; nonce: bigint }[]): Promise<LedgerTx[]> {
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
   * abort the whole process when a thread is cut off inside them. (A process exit waits out a
   * signature under way: see waitOutSignatures.)
   */
  async close(): Promise<void> {
    if (!this.alive) return
    this.alive = false
    const exited = new Promise((r) => this.thread.once('exit', r))
    this.thread.ref()
    this.thread.postMessage({ stop: true })
    await exited
    gates.delete(this.gate) // gone: nothing for an exit to wait out
  }

  private fail(e: Error): void {
    this.alive = false
    gates.delete(this.gate)
    for (const w of this.waiting.values()) w.reject(e)
    this.waiting.clear()
  }
}
