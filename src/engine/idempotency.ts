import { createHash } from 'node:crypto'
import { PaygateError } from '../errors/index.js'
import type { Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'

export interface StoredResult {
  hash: string
  createdAt: number
  result: unknown
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
  ) {
    this.results = store.collection('idempotency')
  }

  /** `fn`'s result must be plain JSON; a stored definite error is thrown again on replay. */
  async run<T>(agentId: string, key: string, hash: string, fn: () => Promise<T>): Promise<T> {
    const k = `${agentId}\x00${key}`
    const running = this.inflight.get(k)
    if (running) {
      if (running.hash !== hash) throw new PaygateError('idempotency_conflict', 'this idempotencyKey is in use by a different request')
      await running.done.catch(() => undefined)
      return this.run(agentId, key, hash, fn)
    }
    // Claim the key before the first await, so a racing call with the same key waits for this one.
    const done = (async () => {
      const stored = await this.results.get(k)
      if (stored && stored.createdAt + this.ttlMs > this.clock.now()) {
        if (stored.hash !== hash) throw new PaygateError('idempotency_conflict', 'this idempotencyKey was used with a different request')
        const err = storedError(stored.result)
        if (err) throw err
        return stored.result as T
      }
      try {
        const r = await fn()
        await this.results.put(k, { hash, createdAt: this.clock.now(), result: r })
        return r
      } catch (e) {
        // A definite answer is a result too (a rejection, a failed payment whose reservation may
        // still be held): replays see it and never pay again. Internal errors are not stored.
        if (e instanceof PaygateError && !['internal_error', 'unavailable', 'idempotency_conflict'].includes(e.code)) {
          await this.results.put(k, { hash, createdAt: this.clock.now(), result: { error: { code: e.code, detail: e.detail, extra: e.extra } } })
        }
        throw e
      }
    })()
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
function storedError(s: unknown): PaygateError | null {
  const e = (s as { error?: { code: string; detail: string; extra: Record<string, unknown> } }).error
  return e ? new PaygateError(e.code as never, e.detail, e.extra) : null
}
