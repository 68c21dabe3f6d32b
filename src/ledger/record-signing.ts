import type { LedgerEntry, LedgerWriter, LedgerTx } from '../chain/ledger-tx.js'

/** The same ledger record, field by field. */
const sameEntry = (a: LedgerEntry, b: LedgerEntry): boolean =>
  a.id === b.id &&
  a.parentTxHash === b.parentTxHash &&
  a.agentId === b.agentId &&
  a.amount === b.amount &&
  a.protocol === b.protocol &&
  a.origin === b.origin &&
  a.pathHash === b.pathHash &&
  a.depth === b.depth

/**
 * Which transaction each of the outbox's records gets (signed, or unsigned for the embedded
 * chain: LedgerWriter): the one made ahead for it (a lone payment's, while its retry was on the
 * wire, or as it is stored if its answer came first), when it still holds; else the group's,
 * one request a group (to the signing thread when records are signed: LedgerWriter.signMany).
 */
export class RecordSigning {
  /** A record signed ahead, with the nonce and stamp it was signed under. */
  private ahead: { entry: LedgerEntry; nonce: bigint; stamp: string; signed: LedgerTx } | null = null
  /** The entry `askAhead` was last given, until its turn comes or `signAll` makes it. */
  private asked: LedgerEntry | null = null

  constructor(private readonly writer: LedgerWriter) {}

  /**
   * Sign `entry` under `nonce` now. Here, not on the signing thread: this thread is idle while
   * the retry is on the wire, and the thread's answer would need a turn of this loop before
   * the record could use it.
   */
  signAhead(entry: LedgerEntry, nonce: bigint): void {
    try {
      this.ahead = { entry, nonce, stamp: this.writer.stamp(), signed: this.writer.sign(entry, nonce) }
    } catch {
      this.ahead = null // the record is signed again when stored, and what is wrong reported then
    }
  }

  /**
   * Sign `entry` ahead on the next turn of the event loop, after the caller's request is written
   * (undici writes a reused socket's request on an immediate too), under the nonce `nonce()`
   * gives then (null: not at all). If the record is stored first (the answer was read before
   * that turn: a fast target on loopback), `signAll` makes it at once, on this thread, rather
   * than sending it to the signing thread and back.
   */
  askAhead(entry: LedgerEntry, nonce: () => bigint | null): void {
    this.asked = entry
    setImmediate(() => {
      if (this.asked !== entry) return
      this.asked = null
      const n = nonce()
      if (n !== null) this.signAhead(entry, n)
    })
  }

  /** Records up to (not including) `next` are stored: a guess below it can no longer hold. */
  passed(next: bigint): void {
    if (this.ahead && this.ahead.nonce < next) this.ahead = null
  }

  /** The transactions of `entries` under the nonces from `from` on. */
  async signAll(entries: readonly LedgerEntry[], from: bigint): Promise<LedgerTx[]> {
    if (entries.length === 1 && this.asked === entries[0]) {
      this.asked = null
      this.signAhead(entries[0]!, from)
    }
    const out: LedgerTx[] = []
    const rest: { entry: LedgerEntry; nonce: bigint }[] = []
    const restAt: number[] = []
    entries.forEach((entry, i) => {
      const nonce = from + BigInt(i)
      const a = this.ahead
      if (a && a.nonce === nonce && sameEntry(a.entry, entry) && a.stamp === this.writer.stamp()) {
        this.ahead = null
        out[i] = a.signed
      } else {
        rest.push({ entry, nonce })
        restAt.push(i)
      }
    })
    if (rest.length) {
      const signed = await this.writer.signMany(rest)
      restAt.forEach((at, j) => {
        out[at] = signed[j]!
      })
    }
    return out
  }
}
