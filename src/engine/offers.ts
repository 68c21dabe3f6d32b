import { Readable } from 'node:stream'
import { PaygateError } from '../errors/index.js'
import { pickProtocol } from '../policy/decide.js'
import type { ProtocolPreference } from '../policy/model.js'
import type { HttpAnswer, PayableChain, ProtocolName } from '../protocols/types.js'
import { collectUpTo, headThen } from '../util/collect.js'
import type { Detected, PayRequest, Plan, ProtocolAdapter } from './adapters/types.js'
import { unreachable } from '../upstream/errors.js'
import { bodyDeadline, type UpstreamResponse } from '../upstream/upstream.js'

/** The stage that reads a 402 and picks what to pay: `read402`, then `detectAll`, then the pure `choosePlan`. */

export const MAX_402_BODY = 256 * 1024

export interface Read402 {
  answer: HttpAnswer
  /** The body was longer than MAX_402_BODY and was not read for offers. */
  cut: boolean
  /** The 402 as it came, to pass on when it is not paid. */
  whole(): UpstreamResponse
  /** Drop what was not read (when it is paid). */
  drop(): void
}

/**
 * A 402 as the adapters read it: its body up to MAX_402_BODY, within `deadlineMs` as a whole.
 * A longer body is not read for offers (offers in headers still are, so a large HTML page never
 * hides them) and is passed on whole when the 402 is not paid, or dropped when it is.
 */
export async function read402(res: UpstreamResponse, deadlineMs: number): Promise<Read402> {
  const { head, rest } = await collectUpTo(res.body, MAX_402_BODY, undefined, bodyDeadline(deadlineMs)).catch(unreachable)
  return {
    answer: { status: 402, headers: res.headers, body: rest ? Buffer.alloc(0) : head },
    cut: rest !== null,
    whole: () => ({ status: 402, headers: res.headers, body: rest ? headThen(head, rest) : Readable.from([head]) }),
    drop: () => rest?.destroy(),
  }
}

/** What one adapter made of a 402. */
export interface Detection {
  protocol: ProtocolName
  detected: Detected
}

/** Every adapter reads the 402; one failing never hides another (its failure goes to `onError`). */
export function detectAll(adapters: readonly ProtocolAdapter[], answer: HttpAnswer, req: PayRequest, chain: PayableChain, onError: (e: unknown, protocol: ProtocolName) => void): Detection[] {
  const out: Detection[] = []
  for (const adapter of adapters) {
    try {
      out.push({ protocol: adapter.protocol, detected: adapter.detect(answer, req, chain) })
    } catch (e) {
      onError(e, adapter.protocol)
    }
  }
  return out
}

export type Choice = { plan: Plan } | { unpaid: PaygateError; refetch?: boolean }

/**
 * Pick the plan to pay from the detections, by the policy's preference among the payable
 * ones (adapters of one protocol, such as MPP's two shapes, in order: the first payable wins).
 * Offers of 0 USDC are not payable: paying one would sign an authorization and spend a ledger
 * record for nothing. `refetch`: only expired challenges were found where a fresh 402 could
 * bring payable ones (allowed once, `mayRefetch`).
 */
export function choosePlan(detections: readonly Detection[], pref: ProtocolPreference, mayRefetch: boolean): Choice {
  const plans = new Map<ProtocolName, Plan>()
  const problems: string[] = []
  let present = 0
  let malformed = 0
  const expired = new Set<ProtocolName>()
  for (const { protocol, detected: d } of detections) {
    if (!d.present) continue
    present++
    if (d.plan && d.plan.amount === 0n) problems.push(`an offer of 0 USDC (${protocol}), which Paygate does not pay`)
    else if (d.plan) {
      if (!plans.has(protocol)) plans.set(protocol, d.plan)
    } else {
      problems.push(d.why)
      if (d.malformed) malformed++
      if (d.expired) expired.add(protocol)
    }
  }
  // The preferred protocol offered only expired challenges: fetch fresh ones rather than fall back.
  const preferred = pickProtocol(pref, ['x402', 'mpp'])!
  if (mayRefetch && expired.has(preferred) && !plans.has(preferred)) return { unpaid: new PaygateError('no_payable_offer', 'expired challenges'), refetch: true }
  const chosen = pickProtocol(pref, [...plans.keys()])
  if (chosen) return { plan: plans.get(chosen)! }
  if (present === 0) return { unpaid: new PaygateError('payment_protocol_error', 'the target answered 402 without a payment requirement in any known shape') }
  if (malformed === present) return { unpaid: new PaygateError('payment_protocol_error', `the target's 402 cannot be read: ${problems.join('; ')}`) }
  return { unpaid: new PaygateError('no_payable_offer', `the target's 402 has ${problems.join('; ')}`), ...(mayRefetch && expired.size > 0 ? { refetch: true } : {}) }
}
