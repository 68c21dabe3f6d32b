import { formatUnits } from '../util/money.js'
import type { Decision } from './decide.js'
import { matchesAny } from './domains.js'
import type { StoredPolicy } from './model.js'
import { heldAmount, usedToday, type UsageState } from './usage.js'

/**
 * The money rules of an invocation's cap, pure: plain data in, plain data out.
 *
 * An invocation I has a cap C. `spent` is what its subtree paid (its own payments and those of
 * closed nested invocations); `holds` are what is still open under it: payments in flight (by
 * transaction id) and the caps of open nested invocations (by invocation id). A payment P
 * carrying I's token fits when spent + held + P <= C; a nested cap C' is carved the same way.
 */
export interface CapState {
  /** Base units. */
  cap: string
  spent: string
  /** Open amounts under the cap, by payment transaction id or nested invocation id. */
  holds: Record<string, string>
}

export const emptyCap = (cap: bigint): CapState => ({ cap: cap.toString(), spent: '0', holds: {} })

export const capHeld = (s: CapState): bigint => Object.values(s.holds).reduce((a, v) => a + BigInt(v), 0n)

/** What is left of the cap: C - spent - held (never below 0). */
export function capLeft(s: CapState): bigint {
  const left = BigInt(s.cap) - BigInt(s.spent) - capHeld(s)
  return left > 0n ? left : 0n
}

const usd = (units: bigint): string => `${formatUnits(units)} USDC`

/** Does `amount` fit under the cap? `budget_exceeded` with a detail when it does not. */
export function fitsCap(s: CapState, amount: bigint): { ok: true } | { ok: false; detail: string } {
  const used = BigInt(s.spent) + capHeld(s)
  if (used + amount <= BigInt(s.cap)) return { ok: true }
  return { ok: false, detail: `payment of ${usd(amount)} with ${usd(used)} spent or held would exceed the invocation budget of ${usd(BigInt(s.cap))}` }
}

/** Hold `amount` under the cap for `id` (a payment in flight, or a nested invocation's cap). */
export const holdUnder = <S extends CapState>(s: S, id: string, amount: bigint): S => ({ ...s, holds: { ...s.holds, [id]: amount.toString() } })

/** A payment under the cap ended: `paid` moves its hold to spent, otherwise it is dropped. */
export function settleUnder<S extends CapState>(s: S, id: string, paid: boolean): S {
  const amount = s.holds[id]
  if (amount === undefined) return s
  const { [id]: _, ...holds } = s.holds
  return { ...s, spent: paid ? (BigInt(s.spent) + BigInt(amount)).toString() : s.spent, holds }
}

/**
 * A nested invocation closed: its carved cap is released from the parent, what it spent counts
 * as the parent's spend, and its payments still unknown (`pending`, by transaction id) stay held
 * in the parent until they settle.
 */
export function closeNested<S extends CapState>(parent: S, childId: string, child: CapState): S {
  const { [childId]: _, ...holds } = parent.holds
  return { ...parent, spent: (BigInt(parent.spent) + BigInt(child.spent)).toString(), holds: { ...holds, ...child.holds } }
}

/**
 * May an orchestrator open an invocation with cap `cap` against `agentEndpoint`'s host? Its
 * domain lists apply to the endpoint, and the cap is held against its daily budget (when it has
 * one) in full: it must fit beside what it spent and holds today.
 */
export function decideCapHold(policy: StoredPolicy, usage: UsageState, req: { host: string; cap: bigint }, now: number): Decision {
  const { host, cap } = req
  if (matchesAny(policy.blockedDomains, host)) return { ok: false, reason: 'domain_blocked', detail: `${host} is in blockedDomains` }
  if (policy.allowedDomains && !matchesAny(policy.allowedDomains, host)) return { ok: false, reason: 'domain_not_allowed', detail: `${host} is not in allowedDomains` }
  if (policy.dailyBudget !== undefined) {
    const budget = BigInt(policy.dailyBudget)
    const used = usedToday(usage, now) + heldAmount(usage)
    if (used + cap > budget) {
      return { ok: false, reason: 'daily_budget_exceeded', detail: `an invocation budget of ${usd(cap)} with ${usd(used)} used would exceed the daily budget of ${usd(budget)}` }
    }
  }
  return { ok: true }
}
