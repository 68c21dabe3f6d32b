import type { Registry } from '../agents/registry.js'
import { PaygateError } from '../errors/index.js'
import type { Transactions, TxRecord } from '../ledger/transactions.js'
import { domainPermitted } from '../policy/decide.js'
import { domainOf } from '../policy/domains.js'
import type { InvocationBook, InvocationContext } from '../policy/invocations.js'
import type { StoredPolicy } from '../policy/model.js'
import type { PolicyStore } from '../policy/store.js'
import { SESSION_HEADER } from '../protocols/mpp.js'
import type { MppAdapter } from './adapters/mpp.js'
import type { PayRequest } from './adapters/types.js'
import type { MppSession } from './sessions.js'
import type { PayStart } from './types.js'

export interface StartDeps {
  registry: Registry
  policies: PolicyStore
  transactions: Transactions
  mpp: MppAdapter
  invocations?: InvocationBook
  /** `Accept-Payment` sent with each request that does not carry one. */
  acceptPayment?: string
}

const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({})

/**
 * The start of a payment, before its first send: the agent, the parent it hangs under (or the
 * invocation it joins), its policy and a valid MPP session, checked and gathered into a
 * `PayStart`. From memory alone when it can (`beginCached`), so a repeat caller's first send
 * waits on no store read.
 */
export async function begin(d: StartDeps, request: PayRequest): Promise<PayStart> {
  const { agentId } = request
  await d.registry.requireAgent(agentId)
  const joined = request.invocation !== undefined ? await joinInvocation(d, request.invocation, request.parentTxHash) : null
  const parent = joined ? joined.parent : request.parentTxHash ? await parentOf(d, request.parentTxHash, agentId) : null
  const policy = await d.policies.policyOf(agentId)
  return started(d, request, parent, policy, await d.mpp.session(agentId, request.url, request.origin), joined?.invocation ?? null)
}

/** `begin` from memory alone, or null when a lookup would need the store (then call `begin`). */
export function beginCached(d: StartDeps, request: PayRequest): PayStart | null {
  const { agentId } = request
  if (request.parentTxHash || request.invocation !== undefined || !d.registry.cachedAgent(agentId)) return null
  const policy = d.policies.cachedPolicy(agentId)
  const session = policy && d.mpp.cachedSession(agentId, request.url, request.origin)
  return policy && session !== undefined ? started(d, request, null, policy, session) : null
}

/**
 * A payment carrying an invocation's token: the invocation must be open (else 402
 * `budget_exceeded`), and a `parentTxHash` must be its root or one of its payments (else 400).
 * Without one, the payment hangs under the invocation's root.
 */
async function joinInvocation(d: StartDeps, token: string, parentTxHash: string | undefined): Promise<{ invocation: InvocationContext; parent: TxRecord }> {
  const book = d.invocations
  if (!book) throw new PaygateError('budget_exceeded', 'the X-Paygate-Invocation token is not one of an open invocation')
  const inv = await book.resolve(token)
  const parent = parentTxHash ? await d.transactions.find(parentTxHash) : await d.transactions.get(inv.rootTxId)
  if (!parent?.txHash || !(parent.id === inv.rootTxId || parent.invocation?.id === inv.id)) {
    throw new PaygateError('invalid_request', `parentTxHash ${parentTxHash} is not a node of the invocation this token belongs to`, { extra: { field: 'parentTxHash' } })
  }
  return { invocation: book.context(inv), parent }
}

/**
 * A payment hangs only under the paying agent's own transactions: another agent's tree is not
 * its to grow; and an invocation's tree grows only with that invocation's open token.
 */
async function parentOf(d: StartDeps, hash: string, agentId: string): Promise<TxRecord> {
  const p = await d.transactions.find(hash)
  if (!p?.txHash) throw new PaygateError('invalid_request', `parentTxHash ${hash} is not a known transaction`, { extra: { field: 'parentTxHash' } })
  if (p.kind === 'invocation' || p.invocation) {
    throw new PaygateError('budget_exceeded', `parentTxHash ${hash} is in an invocation's tree: only a payment with that invocation's open X-Paygate-Invocation token joins it`)
  }
  if (p.agentId !== agentId) throw new PaygateError('invalid_request', `parentTxHash ${hash} is not a transaction of agent ${agentId}`, { extra: { field: 'parentTxHash' } })
  return p
}

function started(d: StartDeps, request: PayRequest, parent: TxRecord | null, policy: StoredPolicy, found: MppSession | null, invocation: InvocationContext | null = null): PayStart {
  let req = request
  // A valid MPP session with this service is sent along: no payment if the target takes it.
  const session = found && domainPermitted(policy, domainOf(req.url)) ? found : null
  if (d.acceptPayment && req.headers['accept-payment'] === undefined) req = { ...req, headers: { ...req.headers, 'accept-payment': d.acceptPayment } }
  return { req, parent, policy, session, firstHeaders: session ? { [SESSION_HEADER]: session.token } : NO_HEADERS, invocation }
}
