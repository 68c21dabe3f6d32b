import type { Identity } from '../agents/registry.js'
import { PaygateError } from '../errors/index.js'
import type { Clock } from '../util/clock.js'
import { Lru } from '../util/lru.js'

/**
 * Token bucket: `burst` requests at once, refilled at `perMinute`. Pure arithmetic on an
 * injected clock.
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

  private refill(): void {
    const now = this.clock.now()
    // A clock stepped backwards (NTP) refills nothing rather than draining the bucket.
    this.tokens = Math.min(this.burst, this.tokens + Math.max(0, now - this.last) * (this.perMinute / 60_000))
    this.last = now
  }

  /** Whole seconds until the bucket holds `need` tokens; 0 when it does now. */
  wait(need = 1): number {
    this.refill()
    if (this.tokens >= need) return 0
    return Math.max(1, Math.ceil((need - this.tokens) / (this.perMinute / 60_000) / 1000))
  }

  /** Take one token (call after `wait` said 0). */
  spend(): void {
    this.tokens -= 1
  }

  /** Take one token; when none is left, say how many whole seconds until one is. */
  take(): { ok: true } | { ok: false; retryAfter: number } {
    const retryAfter = this.wait(1)
    if (retryAfter > 0) return { ok: false, retryAfter }
    this.spend()
    return { ok: true }
  }
}

export interface RateLimitSettings {
  /** The account-wide bucket (the spec's account-level API rate). */
  perMinute: number
  burst: number
  /** Each key's own bucket (every agent key and every account key). */
  perKey: { perMinute: number; burst: number }
  /** Share of the account-wide burst that only account keys may take, in percent. */
  accountReservePercent: number
  /** Per client address: requests whose key is missing or wrong. */
  unauthenticated: { perMinute: number; burst: number }
}

/** Keys and addresses with a bucket of their own, at most (the least recently seen go first: a new bucket is a full one). */
const MAX_TRACKED = 10_000

const limited = (detail: string, retryAfter: number): PaygateError =>
  new PaygateError('rate_limited', `${detail}; retry in ${retryAfter} s`, { extra: { retryAfter }, headers: { 'retry-after': String(retryAfter) } })

/**
 * The API's rate limits. A call takes one token from its key's own bucket and one from the
 * account-wide bucket; an agent key may not take the account bucket's last
 * `accountReservePercent` of its burst, which is kept for account-level management (the
 * account key revoking a flooding agent key). So one key cannot starve another key or the
 * operator. Requests whose key fails count only against their client address.
 */
export class ApiRateLimits {
  private readonly account: TokenBucket
  private readonly keys = new Lru<string, TokenBucket>(MAX_TRACKED)
  private readonly addresses = new Lru<string, TokenBucket>(MAX_TRACKED)
  /** Tokens of the account bucket agent keys leave alone. */
  readonly reserve: number

  constructor(
    private readonly s: RateLimitSettings,
    private readonly clock: Clock,
  ) {
    this.account = new TokenBucket(s.perMinute, s.burst, clock)
    this.reserve = Math.floor((s.burst * s.accountReservePercent) / 100)
  }

  /** One call by `identity`: throws 429 `rate_limited` when its key or the account is over its rate. */
  admit(identity: Identity): void {
    let own = this.keys.get(identity.keyId)
    if (!own) this.keys.set(identity.keyId, (own = new TokenBucket(this.s.perKey.perMinute, this.s.perKey.burst, this.clock)))
    const ownWait = own.wait(1)
    if (ownWait > 0) throw limited('API rate limit of this key exceeded', ownWait)
    const accountWait = this.account.wait(1 + (identity.kind === 'agent' ? this.reserve : 0))
    if (accountWait > 0) throw limited('account API rate limit exceeded', accountWait)
    own.spend()
    this.account.spend()
  }

  /** A request from `address` whose key is missing, malformed, unknown or revoked: throws 429 once that address has had too many. */
  refused(address: string): void {
    let b = this.addresses.get(address)
    if (!b) this.addresses.set(address, (b = new TokenBucket(this.s.unauthenticated.perMinute, this.s.unauthenticated.burst, this.clock)))
    const t = b.take()
    if (!t.ok) throw limited('too many requests without a valid API key from this address', t.retryAfter)
  }
}
