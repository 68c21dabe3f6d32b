import type { Registry } from '../agents/registry.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { defaultPolicy, mergePolicy, policyView, type StoredPolicy } from './model.js'
import { emptyUsage, type UsageState } from './usage.js'
import { type StoredUsage, storedUsage, usageFromStore } from './usage-codec.js'

/** Policies and usage per agent, in LevelDB; changes for one agent are serialised. */
export class PolicyStore {
  private readonly policies: Collection<StoredPolicy>
  private readonly usage: Collection<StoredUsage>

  /** Write-through caches: this process is the only writer of its data directory. */
  private readonly policyCache = new Map<string, StoredPolicy>()
  private readonly usageCache = new Map<string, UsageState>()
  /**
   * On a store shared by replicas (PostgreSQL) another process may write any agent's policy
   * and usage: nothing is cached, so the locked section reads usage under the cross-process
   * lock and a policy changed through any replica applies at once.
   */
  private readonly cached: boolean

  constructor(
    private readonly store: Store,
    private readonly registry: Registry,
    private readonly clock: Clock,
  ) {
    this.cached = store.backend !== 'postgres'
    this.policies = store.collection('policies')
    this.usage = store.collection('usage')
    registry.onAgentDelete(
      (agentId): BatchOp[] => [
        { type: 'del', coll: this.policies, key: agentId },
        { type: 'del', coll: this.usage, key: agentId },
      ],
      // Only once the delete is written: cleared earlier, a concurrent read would cache the
      // old policy again, and an agent recreated under the same id would inherit it.
      (agentId) => {
        this.policyCache.delete(agentId)
        this.usageCache.delete(agentId)
      },
    )
  }

  /** The policy if it is in memory (no store read). */
  cachedPolicy(agentId: string): StoredPolicy | undefined {
    return this.policyCache.get(agentId)
  }

  async policyOf(agentId: string): Promise<StoredPolicy> {
    if (!this.cached) return (await this.policies.get(agentId)) ?? defaultPolicy()
    const hit = this.policyCache.get(agentId)
    if (hit) return hit
    const revision = this.registry.revision
    const p = (await this.policies.get(agentId)) ?? defaultPolicy()
    // A policy cached meanwhile (`update`) is newer than what was read.
    if (revision === this.registry.revision && !this.policyCache.has(agentId)) this.policyCache.set(agentId, p)
    return this.policyCache.get(agentId) ?? p
  }

  /** The usage if it is in memory (no store read). */
  cachedUsage(agentId: string): UsageState | undefined {
    return this.usageCache.get(agentId)
  }

  async usageOf(agentId: string): Promise<UsageState> {
    if (!this.cached) return this.readUsage(agentId)
    const hit = this.usageCache.get(agentId)
    if (hit) return hit
    const revision = this.registry.revision
    const u = await this.readUsage(agentId)
    // A cached value that came in meanwhile (`usageOp`) is newer than what was read.
    if (revision === this.registry.revision && !this.usageCache.has(agentId)) this.usageCache.set(agentId, u)
    return this.usageCache.get(agentId) ?? u
  }

  /**
   * A batch op that stores an agent's usage (the engine writes it with its records, under
   * its per-agent lock). The cache takes the new value at once and is the newest state;
   * the op writes whatever the cache holds when its batch is written, so batches that land
   * after a later change never store an older state. `forgetUsage` drops the cache if a
   * batch fails.
   */
  usageOp(agentId: string, u: UsageState): BatchOp {
    if (!this.cached) return { type: 'put', coll: this.usage, key: agentId, value: storedUsage(u) }
    const before = this.usageCache.get(agentId)
    this.usageCache.set(agentId, u)
    // `value` is only a fallback (both backends log `latest`); in the array form it reads back the same.
    return { type: 'put', coll: this.usage, key: agentId, value: u, latest: () => storedUsage(this.usageCache.get(agentId) ?? u, before) }
  }

  private async readUsage(agentId: string): Promise<UsageState> {
    const s = await this.usage.get(agentId)
    return s ? usageFromStore(s) : emptyUsage()
  }

  forgetUsage(agentId: string): void {
    this.usageCache.delete(agentId)
  }

  async view(agentId: string): Promise<Record<string, unknown>> {
    await this.registry.requireAgent(agentId)
    const [p, u] = await Promise.all([this.policyOf(agentId), this.usageOf(agentId)])
    return policyView(agentId, p, u, this.clock.now())
  }

  /**
   * Merge a PUT body into the agent's policy and answer the policy as read back. `createAgent`:
   * an agent that does not exist is created with it, in the same write (a bad body creates none).
   */
  async update(agentId: string, body: unknown, opts: { createAgent?: boolean } = {}): Promise<Record<string, unknown>> {
    return this.registry.withAgentOrNew(
      agentId,
      async (_agent, createAgent) => {
        const next = mergePolicy(await this.policyOf(agentId), body, agentId)
        next.updatedAt = new Date(this.clock.now()).toISOString()
        await this.store.batch([...createAgent, { type: 'put', coll: this.policies, key: agentId, value: next }])
        if (this.cached) this.policyCache.set(agentId, next)
        return policyView(agentId, next, await this.usageOf(agentId), this.clock.now())
      },
      { create: opts.createAgent === true },
    )
  }
}
