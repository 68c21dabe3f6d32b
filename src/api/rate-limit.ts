import type { Clock } from '../util/clock.js'

/**
 * Token bucket for the account-level API rate: `burst` requests at once, refilled at
 * `perMinute`. Pure arithmetic on an injected clock.
 */
export class TokenBucket {
  private tokens: number
  private last: number

  constructor(
    private readonly perMinute: number,
    private readonly burst: number,
    private readonly clock: Clock,
  ) {
    this.tokens = burst
    this.last = clock.now()
  }

  /** Take one token; when none is left, say how many whole seconds until one is. */
  take(): { ok: true } | { ok: false; retryAfter: number } {
    const now = this.clock.now()
    const perMs = this.perMinute / 60_000
    // A clock stepped backwards (NTP) refills nothing rather than draining the bucket.
    this.tokens = Math.min(this.burst, this.tokens + Math.max(0, now - this.last) * perMs)
    this.last = now
    if (this.tokens >= 1) {
      this.tokens -= 1
      return { ok: true }
    }
    return { ok: false, retryAfter: Math.max(1, Math.ceil((1 - this.tokens) / perMs / 1000)) }
  }
}
