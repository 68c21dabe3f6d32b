import { parentPort, workerData } from 'node:worker_threads'
import type { Hex } from 'viem'
import { FastSigner } from '../crypto/secp256k1.js'
import type { LedgerEntry } from './ledger-tx.js'
import { GATE_STATE, GATE_STOP, IDLE, SIGNING } from './ledger-sign-gate.js'
import { LedgerSigner, type LedgerSignContext, type LedgerTx } from './ledger-signer.js'

/** The signing thread's side (see ledger-sign-thread.ts): signs each request's records in order and answers with their bytes and hashes. */
const data = workerData as { key: Hex; gate: SharedArrayBuffer }
const gate = new Int32Array(data.gate)
/** Made at the first request, inside the gate (the key's import is a native call too). */
let signer: LedgerSigner | undefined

interface Request {
  id: number
  ctx: LedgerSignContext
  items: { entry: LedgerEntry; nonce: bigint }[]
}

parentPort!.on('message', (m: Request | { stop: true }) => {
  // Asked to stop, after every request before it was answered (exit: tsx's loader, when run from source, keeps a port of its own open).
  if ('stop' in m) return process.exit(0)
  const { id, ctx, items } = m
  // Signing, then the exit's stop checked before every signature: the process is exiting, and
  // must not cut this thread off inside the native addons (nothing more is answered).
  Atomics.store(gate, GATE_STATE, SIGNING)
  try {
    const signed: LedgerTx[] = []
    for (const i of items) {
      if (Atomics.load(gate, GATE_STOP)) return
      signer ??= new LedgerSigner(new FastSigner(data.key))
      signed.push(signer.sign(ctx, i.entry, i.nonce))
    }
    parentPort!.postMessage({ id, signed })
  } catch (e) {
    parentPort!.postMessage({ id, error: e instanceof Error ? e.message : String(e) })
  } finally {
    Atomics.store(gate, GATE_STATE, IDLE)
    Atomics.notify(gate, GATE_STATE)
  }
})
