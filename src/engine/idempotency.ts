import { createHash } from 'node:crypto'
import { PaygateError, storedError } from '../errors/index.js'
import type { Collection, Store } from '../store/index.js'
import type { CrossLocks } from '../store/leases.js'
import type { Clock } from '../util/clock.js'

export interface StoredResult {
  hash: string
  createdAt: number
  result: unknown
  /** Written before the request runs and replaced by its result: found on a later call, the run was cut off (a crash). */
  pending?: true
}

/** Canonical digest of a logical request: same target, method, headers, body and parent. */
export function requestDigest(parts: { url: string; method: string; headers: Record<string, string>; body: Buffer | null; parentTxHash?: string }): string {
  const h = createHash('sha256')
  h.update(`${parts.method.toUpperCase()} ${parts.url}\n`)
  for (const k of Object.keys(parts.headers).sort()) h.update(`${k.toLowerCase()}: ${parts.headers[k]}\n`)
  h.update('\n')
  if (parts.body) h.update(parts.body)
  return h.digest('hex') + (parts.parentTxHash ?? '')
}

/** JSON with object keys sorted at every depth: the same value always gives the same text. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`
  if (v !== null && typeof v === 'object') {
    const o = v as Record<string, unknown>
    return `{${Object.keys(o)
      .sort()
      .filter((k) => o[k] !== undefined)
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`)
      .join(',')}}`
  }
  return JSON.stringify(v)
}

/** Errors that are never stored: the service's own trouble, or a key in use. */
const NEVER_STORED: ReadonlySet<string> = new Set(['internal_error', 'unavailable', 'idempotency_conflict'])

/**
 * For any caller of `engine.pay`: `upstream_unreachable` means no authorization was stored or
 * sent (one signed ahead, see AheadSigner, is dropped unused), so nothing can have been paid.
 * The engine raises it only for its unpaid sends (the first request, a refetched 402, a
 * session call); a failed send of a payment is a retried delivery that ends in
 * `payment_failed`. Such an error is not stored: the same key runs again. The same holds for
 * `egress_denied` (the guard refused the connection, so nothing was sent), which an operator
 * may lift by configuration.
 */
export const unreached = (e: PaygateError): boolean => e.code === 'upstream_unreachable' || e.code === 'egress_denied'

/**
 * `unreached`, plus a 402 that could not be read (`payment_protocol_error` naming no
 * transaction; a payment the target refused as malformed names its `transactionId`). Only
 * for a caller whose own code raises nothing once a payment is made (`POST /v1/pay`): the
 * proxy's read of a paid answer can fail with that code, and that must be stored.
 */
export const nothingSigned = (e: PaygateError): boolean => unreached(e) || (e.code === 'payment_protocol_error' && e.extra.transactionId === undefined)

/** A first run's verdict: keep `keep` for replays (this call may get `live` instead), or answer `pass` to this call alone. */
export type Attempt<T, L> = { keep: T; live?: L } | { pass: L }

/** What a call under a key gets: the kept result (and this call's own `live` answer, if any), or an answer that was not kept. */
export type Replayed<T, L> = { kept: T; live?: L } | { live: L }

/**
 * Idempotency keys per agent, kept `ttlMs`. The same key with the same request returns
 * the stored result; a racing second call waits for the first; another request under the
 * same key is 409 `idempotency_conflict`.
 */
export class Idempotency {
  private readonly results: Collection<StoredResult>
  private readonly inflight = new Map<string, { hash: string; done: Promise<unknown> }>()

  constructor(
    store: Store,
    private readonly clock: Clock,
    private readonly ttlMs: number,
    /** On a shared store, a key's run holds a lease in every replica, so a call on another replica waits for it too. */
    private readonly locks?: CrossLocks,
  ) {
    this.results = store.collection('idempotency')
  }

  /**
   * `fn`'s result must be plain JSON; a stored definite error is thrown again on replay.
   * `unpaid` picks the errors after which nothing can have been paid: they are not stored.
   * See `attempt` for a run that may answer without keeping its result.
   */
  async run<T>(
    agentId: string,
    key: string,
    hash: string,
    fn: () => Promise<T>,
    unpaid: (e: PaygateError) => boolean = unreached,
    recover?: (startedAt: number) => Promise<T | undefined>,
  ): Promise<T> {
    const out = await this.attempt<T, never>(agentId, key, hash, async () => ({ keep: await fn() }), unpaid, recover)
    return (out as { kept: T }).kept
  }

  /**
   * The one replay of the service (the proxy and `POST /v1/pay` both go through it). `fn` says
   * in its returned value whether its result is kept: `{keep}` stores it for replays (with,
   * optionally, a `live` answer for this call alone, such as a body streamed through), `{pass}`
   * answers this call only and clears the key, so the next call runs again.
   *
   * A marker is stored (durably) before `fn` runs. Found by a later call, it means the run was
   * cut off by a crash, its outcome unknown here: `recover(startedAt)` rebuilds the result
   * from what was recorded (a payment's transaction), returns undefined when nothing of that
   * run went out (then `fn` runs again), or throws (a definite error is stored as above).
   * Without `recover`, `fn` runs again.
   */
  async attempt<T, L>(
    agentId: string,
    key: string,
    hash: string,
    fn: () => Promise<Attempt<T, L>>,
    unpaid: (e: PaygateError) => boolean = unreached,
    recover?: (startedAt: number) => Promise<T | undefined>,
  ): Promise<Replayed<T, L>> {
    const k = `${agentId}\x00${key}`
    const running = this.inflight.get(k)
    if (running) {
      if (running.hash !== hash) throw new PaygateError('idempotency_conflict', 'this idempotencyKey is in use by a different request')
      await running.done.catch(() => undefined)
      return this.attempt(agentId, key, hash, fn, unpaid, recover)
    }
    // Claim the key before the first await, so a racing call with the same key waits for this one.
    const run = async (): Promise<Replayed<T, L>> => {
      const stored = await this.results.get(k)
      let interrupted: number | null = null
      if (stored && stored.createdAt + this.ttlMs > this.clock.now()) {
        if (stored.hash !== hash) throw new PaygateError('idempotency_conflict', 'this idempotencyKey was used with a different request')
        if (!stored.pending) {
          const err = clientError(stored.result)
          if (err) throw err
          return { kept: stored.result as T }
        }
        interrupted = stored.createdAt
      }
      const keep = (r: unknown): Promise<void> => this.results.put(k, { hash, createdAt: interrupted ?? this.clock.now(), result: r })
      try {
        if (interrupted !== null && recover) {
          const r = await recover(interrupted)
          if (r !== undefined) {
            await keep(r)
            return { kept: r }
          }
        }
        if (interrupted === null) await this.results.put(k, { hash, createdAt: this.clock.now(), result: null, pending: true })
        const r = await fn()
        if ('pass' in r) {
          await this.results.del(k)
          return { live: r.pass }
        }
        await keep(r.keep)
        return r.live === undefined ? { kept: r.keep } : { kept: r.keep, live: r.live }
      } catch (e) {
        // A definite answer is a result too: a rejection, or a failed payment (`payment_failed`:
        // a payment was attempted, it may yet settle and its reservation may still be held), so
        // replays see it and never pay again. Internal errors are not stored, nor errors raised
        // before anything was signed (the target down, its 402 unreadable): a retry may succeed.
        // After an internal error the marker stays: what the run did is recovered next time.
        if (e instanceof PaygateError && !NEVER_STORED.has(e.code) && !unpaid(e)) await keep({ error: { code: e.code, detail: e.detail, extra: e.extra } })
        else if (e instanceof PaygateError && unpaid(e)) await this.results.del(k)
        throw e
      }
    }
    const locks = this.locks
    const done = locks?.shared ? locks.run(`idempotency\x00${k}`, run) : run()
    this.inflight.set(k, { hash, done })
    try {
      return await done
    } finally {
      this.inflight.delete(k)
    }
  }

  /** Delete results older than the TTL (they are already ignored on read); returns how many. */
  async sweep(): Promise<number> {
    const cutoff = this.clock.now() - this.ttlMs
    const stale: string[] = []
    for await (const [k, v] of this.results.entries()) if (v.createdAt <= cutoff) stale.push(k)
    for (const k of stale) if (!this.inflight.has(k)) await this.results.del(k)
    return stale.length
  }

  /** Sweep every `everyMs` in the background (unref'd: it never keeps the process alive). */
  startSweeping(everyMs = 3_600_000): () => void {
    const timer = setInterval(() => void this.sweep().catch(() => undefined), everyMs)
    timer.unref()
    return () => clearInterval(timer)
  }
}

/** Rebuild a stored client error. */
function clientError(s: unknown): PaygateError | null {
  const e = (s as { error?: { code: string; detail: string; extra: Record<string, unknown> } }).error
  return e ? storedError(e.code, e.detail, e.extra) : null
}
