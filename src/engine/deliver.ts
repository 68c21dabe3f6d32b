import { Readable } from 'node:stream'
import type { Chain } from '../chain/chain.js'
import type { LedgerEntry } from '../chain/ledger-tx.js'
import { isPaygateError, PaygateError, type ErrorCode } from '../errors/index.js'
import type { EventBus } from '../events/bus.js'
import type { Outbox } from '../ledger/outbox.js'
import { isEip3009, type StoredAuthorization, type TxRecord } from '../ledger/transactions.js'
import type { Clock } from '../util/clock.js'
import type { Delivery, PayRequest, Plan } from './adapters/types.js'
import type { Leases } from './leases.js'
import { MAX_402_BODY } from './offers.js'
import { resend, servedEnd, unservedEnd } from './outcome.js'
import { ledgerEntryOf, type Recorder } from './record.js'
import type { PayOutcome } from './types.js'
import { readBody, type UpstreamResponse } from '../upstream/upstream.js'
import { extend } from '../util/extend.js'

export const MAX_ATTEMPTS = 3
/** An authorization this close to expiry is not resent. */
const RESEND_MARGIN_MS = 6_000

export interface DeliverDeps {
  chain: Chain
  outbox: Outbox
  recorder: Recorder
  leases: Leases
  events: EventBus
  clock: Clock
  /** The whole-body deadline for answers read here (pay.timeoutMs). */
  bodyTimeoutMs: number
}

/** The answer of a payment the chain shows settled whose paid answer never came (`cause`: what became of it). */
const lostAnswer = (cause: string): UpstreamResponse => {
  const detail = `the payment settled, but the target's paid answer was lost (${cause}); it is recorded as paid: do not pay again`
  return { status: 502, headers: { 'content-type': 'application/json' }, body: Readable.from([Buffer.from(JSON.stringify({ error: 'upstream_answer_lost', detail }))]) }
}
const expiryMs = (a: StoredAuthorization): number => (isEip3009(a) ? Number(a.validBefore) * 1000 : a.expiresAt)

/** Whether the chain shows the authorization used: null when it cannot say, or there is no chain to ask. */
function usedOnChain(d: DeliverDeps, a: StoredAuthorization): Promise<boolean | null> {
  if (!isEip3009(a)) return Promise.resolve(null)
  return d.chain.authorizationUsed(a.from as `0x${string}`, a.nonce as `0x${string}`).catch(() => null)
}

/** Outbox.signAhead for `rec`, returning the entry for paid() to record; never throws (a record that cannot be built fails in paid()). */
function signLedgerAhead(d: DeliverDeps, rec: TxRecord, plan: Plan): LedgerEntry | undefined {
  try {
    const entry = ledgerEntryOf(rec, plan.protocol)
    d.outbox.signAhead(entry)
    return entry
  } catch {
    return undefined
  }
}

/**
 * The deliver stage: send the payment; on a transient failure resend the SAME authorization
 * once the chain says it was not used, never a second one; end as outcome.ts says (paid,
 * held for the reconciler, or failed and released) through the record stage.
 */
export async function deliver(d: DeliverDeps, req: PayRequest, plan: Plan, signed: TxRecord): Promise<PayOutcome> {
  try {
    return await deliverSigned(d, req, plan, signed)
  } catch (e) {
    throw isPaygateError(e) ? e : unrecorded(signed.id, e)
  }
}

/**
 * What failed after the authorization left Paygate (the store not answering, most likely): the
 * money may have moved, so the answer must not say a retry is safe. The record stays open with
 * its reservation, and the reconciler settles it from the chain once the store answers.
 */
function unrecorded(transactionId: string, cause: unknown): PaygateError {
  return new PaygateError(
    'unavailable',
    `the payment was sent, but its outcome could not be recorded (the store is not answering); money may have moved: do not pay again. It is settled from the chain once the store answers: see GET /v1/transactions/${transactionId}`,
    { extra: { transactionId }, cause },
  )
}

async function deliverSigned(d: DeliverDeps, req: PayRequest, plan: Plan, signed: TxRecord): Promise<PayOutcome> {
  const auth = signed.authorization!
  const onChain = isEip3009(auth)
  let rec = signed
  let last: { response: UpstreamResponse | null; error: string } = { response: null, error: '' }
  let used: boolean | null = null
  let code: ErrorCode = 'payment_failed'
  /** The ledger entry built to sign it ahead, recorded as it is when paid. */
  let entry: LedgerEntry | undefined
  for (let attempt = 1; ; attempt++) {
    rec = extend(rec, { attempts: attempt })
    let sent: Delivery
    try {
      const sending = plan.deliver(req, auth, rec.id)
      // The only payment under way: its ledger record is signed while the retry is on the wire.
      if (attempt === 1 && d.leases.size === 1) entry = signLedgerAhead(d, rec, plan)
      sent = await sending
    } catch (e) {
      sent = { kind: 'transient', response: null, error: (e as Error).message }
    }
    if (sent.kind === 'served') return served(d, rec, plan, sent.response, entry)
    // Refused, 5xx or no answer: the chain says whether the money moved.
    used = onChain ? await usedOnChain(d, auth) : null
    if (used === true) return d.recorder.paid(rec, sent.response ?? lostAnswer(sent.error), plan, entry)
    last = { response: null, error: sent.error }
    if (sent.kind === 'refused' && sent.code) code = sent.code
    if (sent.response) {
      const body = await readBody(sent.response.body, MAX_402_BODY, d.bodyTimeoutMs).catch(() => Buffer.alloc(0))
      last = { response: { status: sent.response.status, headers: sent.response.headers, body: Readable.from([body]) }, error: `${sent.error}: ${body.toString('utf8', 0, 200)}` }
    }
    const again = resend({ refused: sent.kind === 'refused', onChain, used, msLeft: expiryMs(auth) - d.clock.now(), attempt, maxAttempts: MAX_ATTEMPTS, marginMs: RESEND_MARGIN_MS })
    if (!again) break
  }
  // Not paid as far as we know; the authorization left Paygate all the same.
  if (onChain) used = await usedOnChain(d, auth)
  const end = unservedEnd({ used, expired: expiryMs(auth) <= d.clock.now() })
  if (end === 'paid') return d.recorder.paid(rec, last.response ?? lostAnswer(last.error), plan, entry)
  const upstreamStatus = last.response ? { upstreamStatus: last.response.status } : {}
  await d.recorder.finish(rec, { status: end === 'held' ? 'unknown' : 'failed', error: last.error, ...upstreamStatus }, end === 'held' ? 'keep' : 'release')
  d.events.emit('payment.failed', { agentId: rec.agentId, timestamp: new Date().toISOString(), transactionId: rec.id, error: last.error, endpoint: rec.endpoint })
  throw new PaygateError(code, `payment not completed after ${rec.attempts ?? MAX_ATTEMPTS} attempts: ${last.error}`, { extra: { transactionId: rec.id } })
}

/**
 * The target served the paid request: paid when it reports the settlement (checked only on an
 * answer below 400, or when the plan was paid before this answer: mpp/1.0's payment endpoint)
 * or the chain shows it; else held with the target's answer passed on.
 */
async function served(d: DeliverDeps, rec: TxRecord, plan: Plan, response: UpstreamResponse, entry: LedgerEntry | undefined): Promise<PayOutcome> {
  const auth = rec.authorization!
  const onChain = isEip3009(auth)
  const settlement = onChain && (response.status < 400 || plan.paidWhenServed) ? plan.settlement(response.headers) : null
  const reported = settlement?.success === true
  const used = onChain && !reported ? await usedOnChain(d, auth) : null
  if (servedEnd({ onChain, reported, used }) === 'paid') return d.recorder.paid(rec, response, plan, entry, ...(reported ? [settlement] : []))
  // The target holds a valid authorization it may still redeem: held until validBefore (the reconciler commits or releases it).
  const why = used === false ? 'the authorization is not used on chain' : 'the chain could not say whether it settled'
  await d.recorder.finish(rec, { status: 'unknown', error: `the target answered ${response.status} and ${why}`, upstreamStatus: response.status }, 'keep')
  return { response, payment: null, held: { transactionId: rec.id } }
}
