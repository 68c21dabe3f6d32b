import type { Registry } from '../agents/registry.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { KeyedMutex } from '../util/mutex.js'

/** An MPP session bought from one service (origin) by one agent. */
export interface MppSession {
  token: string
  /** Unix ms. */
  expiresAt: number
  createdAt: number
  /** The transaction that paid for it. */
  transactionId: string
}

const keyOf = (agentId: string, origin: string): string => `${agentId}\x00${origin}`

/**
 * MPP sessions per agent and service origin, in LevelDB (they survive restarts) with a
 * read cache. Expired sessions are never returned; they are replaced by the next
 * negotiation and swept with the agent.
 */
export class MppSessions {
  private readonly coll: Collection<MppSession>
  private readonly cache = new Map<string, MppSession | null>()
  /** Saves and drops of one agent and service, one at a time. */
  private readonly writes = new KeyedMutex()
  /** On a store shared by replicas another process may save or drop a session: nothing is cached. */
  private readonly caching: boolean

  constructor(
    store: Store,
    private readonly registry: Registry,
    private readonly clock: Clock,
  ) {
    this.coll = store.collection('mppSessions')
    this.caching = store.backend !== 'postgres'
    registry.onAgentDelete(
      async (agentId): Promise<BatchOp[]> => {
        const ops: BatchOp[] = []
        for await (const k of this.coll.keys({ gte: `${agentId}\x00`, lt: `${agentId}\x01` })) ops.push({ type: 'del', coll: this.coll, key: k })
        return ops
      },
      // Only once the delete is written, so a concurrent read cannot cache a session again
      // for an agent recreated under the same id.
      (agentId) => {
        for (const k of this.cache.keys()) if (k.startsWith(`${agentId}\x00`)) this.cache.delete(k)
      },
    )
  }

  /** As `valid` from memory alone; undefined when that would need a store read. */
  cachedValid(agentId: string, origin: string): MppSession | null | undefined {
    if (!this.caching) return undefined
    const s = this.cache.get(keyOf(agentId, origin))
    return s === undefined ? undefined : this.unexpired(s)
  }

  /** The agent's unexpired session with `origin`, if any. */
  async valid(agentId: string, origin: string): Promise<MppSession | null> {
    const k = keyOf(agentId, origin)
    if (!this.caching) return this.unexpired((await this.coll.get(k)) ?? null)
    let s = this.cache.get(k)
    if (s === undefined) {
      const revision = this.registry.revision
      const read = (await this.coll.get(k)) ?? null
      if (this.cache.size > 10_000) this.cache.clear()
      // A session saved or dropped meanwhile is cached already, and newer than what was read.
      if (revision === this.registry.revision && !this.cache.has(k)) this.cache.set(k, read)
      s = this.cache.get(k) ?? read
    }
    return this.unexpired(s)
  }

  private unexpired(s: MppSession | null): MppSession | null {
    return s && s.expiresAt > this.clock.now() ? s : null
  }

  async save(agentId: string, origin: string, s: MppSession): Promise<void> {
    const k = keyOf(agentId, origin)
    await this.writes.run(k, async () => {
      await this.coll.put(k, s)
      this.cache.set(k, s)
    })
  }

  /** Forget a session the service refused (only if it is still the one stored: a save and a drop of one key take turns). */
  async drop(agentId: string, origin: string, token: string): Promise<void> {
    const k = keyOf(agentId, origin)
    await this.writes.run(k, async () => {
      const cur = (await this.coll.get(k)) ?? null
      if (cur && cur.token === token) await this.coll.del(k)
      this.cache.set(k, cur && cur.token !== token ? cur : null)
    })
  }
}
