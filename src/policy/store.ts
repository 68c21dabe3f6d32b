import type { Registry } from '../agents/registry.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { defaultPolicy, mergePolicy, policyView, type StoredPolicy } from './model.js'
import { emptyUsage, type UsageState } from './usage.js'

/** Policies and usage per agent, in LevelDB; changes for one agent are serialised. */
export class PolicyStore {
  private readonly policies: Collection<StoredPolicy>
  private readonly usage: Collection<UsageState>

  constructor(
    private readonly store: Store,
    private readonly registry: Registry,
    private readonly clock: Clock,
  ) {
    this.policies = store.collection('policies')
    this.usage = store.collection('usage')
    registry.onAgentDelete((agentId): BatchOp[] => [
      { type: 'del', coll: this.policies, key: agentId },
      { type: 'del', coll: this.usage, key: agentId },
    ])
  }

  async policyOf(agentId: string): Promise<StoredPolicy> {
    return (await this.policies.get(agentId)) ?? defaultPolicy()
  }

  async usageOf(agentId: string): Promise<UsageState> {
    return (await this.usage.get(agentId)) ?? emptyUsage()
  }

  /** A batch op that stores an agent's usage (the engine writes it with its records). */
  usageOp(agentId: string, u: UsageState): BatchOp {
    return { type: 'put', coll: this.usage, key: agentId, value: u }
  }

  async view(agentId: string): Promise<Record<string, unknown>> {
    await this.registry.requireAgent(agentId)
    const [p, u] = await Promise.all([this.policyOf(agentId), this.usageOf(agentId)])
    return policyView(agentId, p, u, this.clock.now())
  }

  /** Merge a PUT body into the agent's policy and answer the policy as read back. */
  async update(agentId: string, body: unknown): Promise<Record<string, unknown>> {
    return this.registry.withAgent(agentId, async () => {
      const next = mergePolicy(await this.policyOf(agentId), body, agentId)
      next.updatedAt = new Date(this.clock.now()).toISOString()
      await this.policies.put(agentId, next)
      return policyView(agentId, next, await this.usageOf(agentId), this.clock.now())
    })
  }
}
