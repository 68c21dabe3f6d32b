import type { Registry } from '../agents/registry.js'
import { recordIdOf, ZERO32, type LedgerEntry } from '../chain/ledger-tx.js'
import type { PaymentEngine } from '../engine/engine.js'
import { PaygateError } from '../errors/index.js'
import type { EventBus } from '../events/bus.js'
import { channels } from '../events/channels.js'
import type { Outbox } from '../ledger/outbox.js'
import { endpointOf, newTxId, type Transactions, type TxRecord } from '../ledger/transactions.js'
import { capLeft, decideCapHold } from '../policy/caps.js'
import { domainOf } from '../policy/domains.js'
import { newInvocationId, newInvocationToken, tokenHash, type InvocationBook, type InvocationRecord } from '../policy/invocations.js'
import type { PolicyStore } from '../policy/store.js'
import { capHoldId, hold, release } from '../policy/usage.js'
import type { BatchOp } from '../store/index.js'
import { bodyDeadline } from '../upstream/upstream.js'
import type { Clock } from '../util/clock.js'
import { collect } from '../util/collect.js'
import { formatUnits, usdc } from '../util/money.js'
import { outcome } from '../util/result.js'
import type { Wallets } from '../wallet/wallets.js'
import { brokenAnswer, failedAnswer, invokeFailure, outputOf, withExtra } from './answer.js'

export interface InvokeDeps {
  engine: PaymentEngine
  book: InvocationBook
  registry: Registry
  policies: PolicyStore
  wallets: Wallets
  transactions: Transactions
  outbox: Outbox
  events: EventBus
  clock: Clock
  /** `invoke.timeoutMs`: how long the sub-agent may take for its answer's headers, then again for its whole body. */
  timeoutMs: number
}

export interface InvokeInput {
  /** The orchestrator. */
  agentId: string
  agentEndpoint: string
  task: unknown
  /** Base units. */
  cap: bigint
  runId?: string
  idempotencyKey?: string
  /** The enclosing invocation's token, when a sub-agent nests. */
  parentToken?: string
}

/** The 200 answer of `POST /v1/agents/invoke`. */
export interface InvokeAnswer {
  output: unknown
  totalCost: { usdc: number }
  paymentChain: string[]
  pendingCost?: { usdc: number }
  invocationId: string
  txHash: string
  runId?: string
}

/** Most bytes of a sub-agent's answer kept as `output`. */
export const MAX_OUTPUT_BYTES = 10 * 1024 * 1024

/** What an invocation cost, as its answers show it. */
export function costOf(rec: InvocationRecord): { totalCost: { usdc: number }; paymentChain: string[]; pendingCost?: { usdc: number } } {
  const pending = BigInt(rec.pending ?? '0')
  return { totalCost: usdc(BigInt(rec.spent)), paymentChain: rec.chain, ...(pending > 0n ? { pendingCost: usdc(pending) } : {}) }
}

/**
 * The invocation runner: opens the invocation (root record on the ledger, cap hold), calls the
 * sub-agent through the payment engine (which pays its 402 from the orchestrator's wallet, under
 * the cap), and closes it when the answer is known; the token dies with the close.
 */
export class InvocationRunner {
  constructor(private readonly d: InvokeDeps) {}

  async invoke(input: InvokeInput): Promise<InvokeAnswer> {
    const { agentId } = input
    await this.d.registry.requireAgent(agentId)
    if (!(await this.d.wallets.get(agentId))) throw new PaygateError('not_found', `agent ${agentId} has no wallet (POST /v1/wallets creates one)`)
    const parent = input.parentToken !== undefined ? await this.d.book.resolve(input.parentToken) : null
    const { rec, token } = await this.open(input, parent)
    let answer: { output: unknown } | PaygateError
    try {
      answer = { output: await this.call(rec, token, input) }
    } catch (e) {
      answer = invokeFailure(e, {})
    }
    const closed = await this.close(rec.id, 'closed')
    const cost = costOf(closed)
    if (answer instanceof PaygateError) throw withExtra(answer, { ...cost, invocationId: rec.id, txHash: rec.rootTxHash })
    return { output: answer.output, ...cost, invocationId: rec.id, txHash: rec.rootTxHash, ...(rec.runId ? { runId: rec.runId } : {}) }
  }

  /**
   * Check the orchestrator's domain lists and daily budget, carve a nested cap from its parent,
   * and write in one batch: the root record with its ledger record (a real transaction hash),
   * the invocation, and the cap hold in the orchestrator's usage.
   */
  private async open(input: InvokeInput, parent: InvocationRecord | null): Promise<{ rec: InvocationRecord; token: string }> {
    const { agentId, cap } = input
    const now = this.d.clock.now()
    const id = newInvocationId(now)
    const token = newInvocationToken()
    const rootTxId = newTxId(now)
    const parentRoot = parent ? await this.d.transactions.get(parent.rootTxId) : null
    const depth = parentRoot ? parentRoot.depth + 1 : 0
    const parentTxHash = parent?.rootTxHash ?? null
    const root: TxRecord = {
      id: rootTxId,
      kind: 'invocation',
      agentId,
      status: 'open',
      createdAt: now,
      updatedAt: now,
      endpoint: '',
      method: 'POST',
      protocol: null,
      amount: '0',
      txHash: null,
      parentTxHash,
      depth,
    }
    const base: Omit<InvocationRecord, 'rootTxHash' | 'capHold'> = {
      ...{ id, agentId, status: 'open', createdAt: now, tokenHash: tokenHash(token), rootTxId, depth, parentId: parent?.id ?? null, topId: parent ? (parent.topId ?? parent.id) : id },
      ...{ invokers: [...(parent?.invokers ?? []), agentId], agentEndpoint: input.agentEndpoint, cap: cap.toString(), spent: '0', holds: {}, chain: [] },
      ...(input.runId ? { runId: input.runId } : {}),
      ...(input.idempotencyKey ? { idempotencyKey: input.idempotencyKey } : {}),
    }
    const entry: LedgerEntry = { id: recordIdOf(rootTxId), parentTxHash: (parentTxHash as `0x${string}` | null) ?? ZERO32, agentId, amount: 0n, protocol: '', origin: '', pathHash: ZERO32, depth }
    // A later invocation of a run must not move the run's createdAt (concurrent first ones of a new run may each write theirs).
    const runKnown = input.runId ? await this.d.book.hasRun(agentId, input.runId) : false
    let opened: InvocationRecord | null = null
    let refused: { rec: TxRecord; error: PaygateError } | null = null
    const shared = this.d.book.isShared
    const { result, written: locked } = await this.d.engine.recorder.usage(agentId, async (usage, tx) => {
      const policy = await this.d.policies.policyOf(agentId)
      // A nested cap is carved from its parent's alone: only the domain lists apply here.
      const decision = decideCapHold(policy, usage, { host: domainOf(input.agentEndpoint), cap: parent ? 0n : cap }, now)
      if (!decision.ok) {
        // Recorded as a payment's refusal is (status rejected, with its reason): listed, and counted in the metrics.
        const rec: TxRecord = {
          ...{ id: newTxId(now), agentId, status: 'rejected', createdAt: now, updatedAt: now, endpoint: endpointOf(input.agentEndpoint), method: 'POST', protocol: null },
          ...{ amount: cap.toString(), txHash: null, parentTxHash, depth, reason: decision.reason, detail: decision.detail },
        }
        refused = { rec, error: new PaygateError('policy_violation', decision.detail, { extra: { reason: decision.reason } }) }
        return { ops: this.d.engine.recorder.ops({ kind: 'rejected', record: rec }), result: outcome(Promise.resolve(ZERO32)) }
      }
      let parentOps: BatchOp[] = []
      if (parent) {
        const carved = await this.d.book.carve(tx, parent.id, id, cap)
        if (!carved.ok) throw new PaygateError('budget_exceeded', carved.detail)
        parentOps = carved.ops
      }
      const capHold = !parent && policy.dailyBudget !== undefined
      const usageOps = capHold ? [this.d.policies.usageOp(agentId, hold(usage, { id: capHoldId(id), amount: cap.toString(), at: now, cap: true }))] : []
      const pending = this.d.outbox.record(entry, rootTxId, (hash) => {
        opened = { ...base, rootTxHash: hash, capHold }
        const rootRec: TxRecord = { ...root, txHash: hash, ledger: { status: 'queued' } }
        this.d.transactions.pin(rootRec)
        return [...this.d.transactions.ops(rootRec), ...this.d.book.opened(opened, runKnown), ...(shared ? [] : [...parentOps, ...usageOps])]
      })
      // Shared by replicas: the carve and the cap hold are written under the locks they were
      // decided in (the outbox's batch lands after them, when another replica may have moved on).
      return { ops: shared ? [...parentOps, ...usageOps] : [], result: outcome(pending) }
    })
    const written = await result
    const decided = await locked
    // (set inside the callback, which TypeScript does not follow)
    const refusal = refused as { rec: TxRecord; error: PaygateError } | null
    if (refusal) {
      if (!decided.ok) throw decided.error
      this.announceRefusal(refusal.rec)
      throw refusal.error
    }
    if (!written.ok || !opened || !decided.ok) {
      this.d.policies.forgetUsage(agentId)
      if (shared && decided.ok) await this.undoOpen(agentId, id, parent?.id ?? null)
      if (!shared && parent) await this.d.book.uncarve(parent.id, id)
      if (!shared && opened) this.d.book.dropOpened(opened)
      // Shared, opened but its carve or hold not written: its token is never handed out, and it closes with its parent or at the next sweep.
      throw !decided.ok ? decided.error : written.ok ? new PaygateError('internal_error', 'the invocation was not recorded') : written.error
    }
    return { rec: opened, token }
  }

  /** An opening the orchestrator's policy refused, its rejected record written: announced as a payment's refusal is. */
  private announceRefusal(rec: TxRecord): void {
    const reason = rec.reason ?? ''
    if (channels.paymentRejected.hasSubscribers) channels.paymentRejected.publish({ agentId: rec.agentId, transactionId: rec.id, reason })
    this.d.events.emit('policy.violation', { agentId: rec.agentId, timestamp: new Date(rec.createdAt).toISOString(), reason, detail: rec.detail ?? '', endpoint: rec.endpoint, transactionId: rec.id })
  }

  /** Shared by replicas: give back the carve and the cap hold of an invocation whose opening write failed. */
  private async undoOpen(agentId: string, id: string, parentId: string | null): Promise<void> {
    const { written } = await this.d.engine.recorder.usage(agentId, async (usage, tx) => {
      const ops = parentId ? await this.d.book.uncarve(parentId, id, tx) : []
      if (usage.holds?.some((h) => h.id === capHoldId(id))) ops.push(this.d.policies.usageOp(agentId, release(usage, capHoldId(id))))
      return { ops, result: undefined }
    })
    await written
  }

  /** POST the task to the sub-agent through the engine (its 402 is paid under the cap); the answer's output. */
  private async call(rec: InvocationRecord, token: string, input: InvokeInput): Promise<unknown> {
    const left = capLeft((await this.d.book.live(rec.id)) ?? rec)
    const out = await this.d.engine.pay({
      agentId: rec.agentId,
      url: input.agentEndpoint,
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: 'application/json, */*',
        'x-paygate-invocation': token,
        'x-paygate-parent-tx': rec.rootTxHash,
        'x-paygate-budget-remaining': formatUnits(left),
      },
      body: Buffer.from(JSON.stringify({ task: input.task })),
      invocation: token,
      timeoutMs: this.d.timeoutMs,
    })
    const status = out.response.status
    // Anything but 2xx is a failure: a redirect is not followed (its Location could point anywhere the orchestrator did not choose).
    if (out.unpaid || status < 200 || status > 299) {
      out.response.body.resume()
      throw failedAnswer(status, {})
    }
    const tooLarge = (): Error => new PaygateError('sub_agent_failed', `the sub-agent's answer exceeds ${MAX_OUTPUT_BYTES} bytes`, { extra: { upstreamStatus: status } })
    const body = await collect(out.response.body, MAX_OUTPUT_BYTES, tooLarge, undefined, bodyDeadline(this.d.timeoutMs)).catch((e: unknown) => {
      throw brokenAnswer(e, status)
    })
    return outputOf(body)
  }

  /**
   * Close an invocation (and any nested one still open under it): its token dies, the rest of
   * the cap hold is released from the orchestrator's usage, the root records say how it ended.
   * Closing one already closed returns it as it was stored.
   */
  async close(id: string, status: 'closed' | 'interrupted'): Promise<InvocationRecord> {
    const open = await this.d.book.live(id)
    if (!open) {
      const stored = await this.d.book.get(id)
      if (!stored) throw new PaygateError('internal_error', `invocation ${id} is not known`)
      return stored
    }
    const now = this.d.clock.now()
    const roots = new Map<string, TxRecord | undefined>()
    const { result, written } = await this.d.engine.recorder.usage(open.agentId, async (usage, tx) => {
      // The roots are read first: in memory the close itself must be one synchronous step.
      for (const r of await this.d.book.openTree(id, tx)) roots.set(r.rootTxId, this.d.transactions.liveRecord(r.rootTxId) ?? (await this.d.transactions.get(r.rootTxId)))
      const { closed, ops } = await this.d.book.close(tx, id, status, now)
      if (!closed.length) return { ops: [], result: (await this.d.book.get(id))! }
      for (const c of closed) {
        // Pinned since it opened: its newest state, whatever the outbox wrote meanwhile.
        const prev = this.d.transactions.liveRecord(c.rootTxId) ?? roots.get(c.rootTxId)
        if (prev) ops.push(...this.d.transactions.ops({ ...prev, status, updatedAt: now }, prev))
      }
      const top = closed[0]!
      if (top.capHold) ops.push(this.d.policies.usageOp(top.agentId, release(usage, capHoldId(id))))
      return { ops, result: top }
    })
    const w = await written
    if (!w.ok) throw w.error
    return result
  }
}
