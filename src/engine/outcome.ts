/**
 * How a payment ends, as pure rules over what is known: the engine's deliver stage asks
 * these after each attempt, and their tables are the unit test (test/unit/outcome.test.ts).
 *
 * - `paid`: the money moved (the target reported its settlement, or the chain shows the
 *   authorization used; an off-chain proof is paid once served);
 * - `held`: it may still move: the authorization left Paygate and can be redeemed until it
 *   expires (or the chain cannot be asked), so the reservation stays and the reconciler
 *   decides later;
 * - `failed`: it can no longer move (on-chain, unused and expired): the reservation is released.
 */
export type EndState = 'paid' | 'held' | 'failed'

/** The target served the paid request (an answer that is not a refusal or a transient failure). */
export function servedEnd(o: { onChain: boolean; reported: boolean; used: boolean | null }): EndState {
  if (!o.onChain || o.reported || o.used === true) return 'paid'
  return 'held'
}

/** The attempts ended without a served answer (refused, 5xx, no answer). `used` is null when the chain cannot say (or there is none). */
export function unservedEnd(o: { used: boolean | null; expired: boolean }): EndState {
  if (o.used === true) return 'paid'
  if (o.used === null || !o.expired) return 'held'
  return 'failed'
}

/**
 * After an attempt that was not served: send the SAME authorization again? Not after an
 * outright refusal the chain confirms (or that has no chain to confirm it), not when it
 * expires too soon to be settled, not past the attempt limit.
 */
export function resend(o: { refused: boolean; onChain: boolean; used: boolean | null; msLeft: number; attempt: number; maxAttempts: number; marginMs: number }): boolean {
  if (o.attempt >= o.maxAttempts) return false
  if (o.refused && (o.used === false || !o.onChain)) return false
  return o.msLeft > o.marginMs
}
