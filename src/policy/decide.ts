import { formatUnits } from '../util/money.js'
import { matchesAny } from './domains.js'
import type { ProtocolName } from '../protocols/types.js'
import { RATE_WINDOWS, type ProtocolPreference, type StoredPolicy } from './model.js'
import { heldAmount, paymentsInFlight, paymentsWithin, usedToday, type UsageState } from './usage.js'

export type PolicyReason = 'domain_blocked' | 'domain_not_allowed' | 'per_call_limit_exceeded' | 'rate_limit_exceeded' | 'daily_budget_exceeded'

export type Decision = { ok: true } | { ok: false; reason: PolicyReason; detail: string }

/** The documented order in which policy checks run; the first that fails decides. */
export const CHECK_ORDER: readonly PolicyReason[] = ['domain_blocked', 'domain_not_allowed', 'per_call_limit_exceeded', 'rate_limit_exceeded', 'daily_budget_exceeded']

const usd = (units: bigint): string => `${formatUnits(units)} USDC`

/**
 * Decide whether a payment of `amount` base units to `host` may go ahead, before anything
 * is signed. Pure: the policy, the usage (with in-flight holds counted as spend and as
 * payments) and the clock reading come in as data.
 */
export function decide(policy: StoredPolicy, usage: UsageState, req: { host: string; amount: bigint; covered?: bigint }, now: number): Decision {
  const { host, amount } = req
  // `covered`: the part of the payment an invocation's cap hold already counts (the orchestrator paying inside its own invocation).
  const covered = req.covered ?? 0n
  if (matchesAny(policy.blockedDomains, host)) return { ok: false, reason: 'domain_blocked', detail: `${host} is in blockedDomains` }
  if (policy.allowedDomains && !matchesAny(policy.allowedDomains, host)) {
    return { ok: false, reason: 'domain_not_allowed', detail: `${host} is not in allowedDomains` }
  }
  if (policy.perCallLimit !== undefined && amount > BigInt(policy.perCallLimit)) {
    return { ok: false, reason: 'per_call_limit_exceeded', detail: `payment of ${usd(amount)} exceeds the per-call limit of ${usd(BigInt(policy.perCallLimit))}` }
  }
  if (policy.rateLimit) {
    const inFlight = paymentsInFlight(usage)
    const made = paymentsWithin(usage, now, RATE_WINDOWS[policy.rateLimit.window]) + inFlight
    if (made >= policy.rateLimit.calls) {
      return {
        ok: false,
        reason: 'rate_limit_exceeded',
        detail: `${made} payments in the last ${policy.rateLimit.window} reach the limit of ${policy.rateLimit.calls}`,
      }
    }
  }
  if (policy.dailyBudget !== undefined) {
    const budget = BigInt(policy.dailyBudget)
    const used = usedToday(usage, now) + heldAmount(usage) - covered
    if (used + amount > budget) {
      return {
        ok: false,
        reason: 'daily_budget_exceeded',
        detail: `payment of ${usd(amount)} with ${usd(used)} used would exceed the daily budget of ${usd(budget)}`,
      }
    }
  }
  return { ok: true }
}

/** May the agent deal with `host` at all (blocked and allowed domains only)? Gates the reuse of a bought MPP session. */
export const domainPermitted = (policy: StoredPolicy, host: string): boolean => !matchesAny(policy.blockedDomains, host) && (!policy.allowedDomains || matchesAny(policy.allowedDomains, host))

/**
 * Which protocol pays when a 402 offers several in a form Paygate can pay. `auto` and
 * `x402` take x402 when it is payable, else MPP; `mpp` takes MPP when payable, else x402.
 */
export function pickProtocol(pref: ProtocolPreference, payable: readonly ProtocolName[]): ProtocolName | null {
  const order: ProtocolName[] = pref === 'mpp' ? ['mpp', 'x402'] : ['x402', 'mpp']
  return order.find((p) => payable.includes(p)) ?? null
}
