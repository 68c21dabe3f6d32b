import { parentPort, workerData } from 'node:worker_threads'
import type { Hex } from 'viem'
import { FastSigner } from '../crypto/secp256k1.js'
import type { LedgerEntry } from './ledger-tx.js'
import { LedgerSigner, type LedgerSignContext } from './ledger-signer.js'

/** The signing thread's side (see ledger-sign-thread.ts): signs each request's records in order and answers with their bytes and hashes. */
const signer = new LedgerSigner(new FastSigner((workerData as { key: Hex }).key))

interface Request {
  id: number
  ctx: LedgerSignContext
  items: { entry: LedgerEntry; nonce: bigint }[]
}

parentPort!.on('message', (m: Request | { stop: true }) => {
  // Asked to stop, after every request before it was answered (exit: tsx's loader, when run from source, keeps a port of its own open).
  if ('stop' in m) return process.exit(0)
  const { id, ctx, items } = m
  try {
    parentPort!.postMessage({ id, signed: items.map((i) => signer.sign(ctx, i.entry, i.nonce)) })
  } catch (e) {
    parentPort!.postMessage({ id, error: e instanceof Error ? e.message : String(e) })
  }
})
