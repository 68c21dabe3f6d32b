import { chmodSync, existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { PaygateError, notFound } from '../errors/index.js'
import { type BatchOp, type Collection, exclusive, type Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { randomBase62 } from '../util/random.js'
import { displayPrefix, hashKey, keyKindOf, newApiKey, newKeyId, sameHash, type KeyKind } from './keys.js'

export const AGENT_ID_RE = /^[A-Za-z0-9._-]{1,64}$/
/** Path words under /v1/agents that cannot be agent ids. */
const RESERVED_AGENT_IDS = new Set(['invoke'])

export interface AgentRecord {
  agentId: string
  createdAt: string
}

export interface KeyRecord {
  keyId: string
  kind: KeyKind
  agentId?: string
  hash: string
  prefix: string
  createdAt: string
  revokedAt?: string
}

export type Identity = { kind: 'account'; keyId: string } | { kind: 'agent'; keyId: string; agentId: string }

export interface IssuedKey {
  keyId: string
  apiKey: string
  prefix: string
  createdAt: string
}

/** Something else stored per agent (policy, usage, ...) that goes when the agent goes. */
export type AgentCascade = (agentId: string) => BatchOp[] | Promise<BatchOp[]>
/** Told once an agent's delete is written (still under its lock): the place to drop what is cached of it. */
export type AgentDeleted = (agentId: string) => void

const ENV_KEY_ID = 'key_environment'
const CACHE_MAX = 10_000
const ACCOUNT_KEY_FILE = 'account-key'

export function validateAgentId(id: unknown): string {
  if (typeof id !== 'string' || !AGENT_ID_RE.test(id)) {
    throw new PaygateError('invalid_request', 'agentId must match [A-Za-z0-9._-]{1,64}', { extra: { field: 'agentId' } })
  }
  // URL parsing drops `.` and `..` path segments: such an agent could never be addressed.
  if (/^\.+$/.test(id)) throw new PaygateError('invalid_request', 'agentId cannot be made only of dots', { extra: { field: 'agentId' } })
  if (RESERVED_AGENT_IDS.has(id)) {
    throw new PaygateError('invalid_request', `agentId "${id}" is reserved`, { extra: { field: 'agentId' } })
  }
  return id
}

/**
 * Agents and their API keys. Keys are stored as SHA-256 digests with a digest index for
 * lookup; verified identities are cached in memory (the proxy checks a key on every
 * request) and the cache entry goes the moment a key is revoked or its agent deleted.
 */
export class Registry {
  private readonly agents: Collection<AgentRecord>
  private readonly keys: Collection<KeyRecord>
  private readonly keyByHash: Collection<string>
  private readonly agentKeys: Collection<string>
  private readonly cache = new Map<string, Identity>()
  private readonly agentCache = new Map<string, AgentRecord>()
  private readonly cascades: AgentCascade[] = []
  private readonly deleted: AgentDeleted[] = []
  private readonly envKeyHash: string | null
  /**
   * Bumped whenever a verified key stops being valid or an agent is deleted, so that callers'
   * own caches can tell. A read that began before a bump must not cache what it read: the
   * revoke or delete may have landed in between, and its cache clear has already run.
   */
  private revoked = 0
  /**
   * On a store shared by replicas (PostgreSQL) another process may revoke a key or delete an
   * agent at any moment: nothing is cached, so a revoke through one replica is refused by
   * every replica from its next request on (one indexed read per verification).
   */
  private readonly caching: boolean

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    envAccountKey: string | null = null,
  ) {
    this.agents = store.collection('agents')
    this.keys = store.collection('keys')
    this.keyByHash = store.collection('keyByHash')
    this.agentKeys = store.collection('agentKeys')
    this.envKeyHash = envAccountKey ? hashKey(envAccountKey) : null
    this.caching = store.backend !== 'postgres'
  }

  /** `cascade` adds its ops to the delete's batch; `deleted` runs once that batch is written. */
  onAgentDelete(cascade: AgentCascade, deleted?: AgentDeleted): void {
    this.cascades.push(cascade)
    if (deleted) this.deleted.push(deleted)
  }

  private nowIso(): string {
    return new Date(this.clock.now()).toISOString()
  }

  // ---- verification -------------------------------------------------------------------

  /** The identity behind a presented key, or null when it is malformed, unknown or revoked. */
  async verify(presented: string): Promise<Identity | null> {
    const kind = keyKindOf(presented)
    if (!kind) return null
    const hash = hashKey(presented)
    if (kind === 'account' && this.envKeyHash && sameHash(hash, this.envKeyHash)) return { kind: 'account', keyId: ENV_KEY_ID }
    const hit = this.cache.get(hash)
    if (hit) return hit
    const { value: id, cacheable } = await this.readGuarded(() => this.lookup(hash, kind))
    if (!id || !cacheable || !this.caching) return id
    if (this.cache.size >= CACHE_MAX) this.cache.delete(this.cache.keys().next().value!)
    this.cache.set(hash, id)
    return id
  }

  /**
   * A read for a cache. A revoke or delete written while it ran (the bump follows the write)
   * may postdate what it read, so it is read once more, and only a read nothing overtook may
   * be cached: the change's own cache clear has already run.
   */
  private async readGuarded<T>(read: () => Promise<T>): Promise<{ value: T; cacheable: boolean }> {
    let revision = this.revoked
    let value = await read()
    if (revision !== this.revoked) {
      revision = this.revoked
      value = await read()
    }
    return { value, cacheable: revision === this.revoked }
  }

  private async lookup(hash: string, kind: KeyKind): Promise<Identity | null> {
    const keyId = await this.keyByHash.get(hash)
    if (!keyId) return null
    const rec = await this.keys.get(keyId)
    if (!rec || rec.revokedAt || rec.kind !== kind || !sameHash(rec.hash, hash)) return null
    return rec.kind === 'agent' ? { kind: 'agent', keyId, agentId: rec.agentId! } : { kind: 'account', keyId }
  }

  // ---- keys ---------------------------------------------------------------------------

  private keyOps(kind: KeyKind, agentId?: string): { issued: IssuedKey; ops: BatchOp[] } {
    const apiKey = newApiKey(kind)
    const rec: KeyRecord = {
      keyId: newKeyId(),
      kind,
      ...(agentId ? { agentId } : {}),
      hash: hashKey(apiKey),
      prefix: displayPrefix(apiKey),
      createdAt: this.nowIso(),
    }
    const ops: BatchOp[] = [
      { type: 'put', coll: this.keys, key: rec.keyId, value: rec },
      { type: 'put', coll: this.keyByHash, key: rec.hash, value: rec.keyId },
    ]
    if (agentId) ops.push({ type: 'put', coll: this.agentKeys, key: `${agentId}\x00${rec.keyId}`, value: rec.keyId })
    return { issued: { keyId: rec.keyId, apiKey, prefix: rec.prefix, createdAt: rec.createdAt }, ops }
  }

  async issueAgentKey(agentId: string): Promise<IssuedKey> {
    return this.withAgent(agentId, async () => {
      const { issued, ops } = this.keyOps('agent', agentId)
      await this.store.batch(ops)
      return issued
    })
  }

  async issueAccountKey(): Promise<IssuedKey> {
    const { issued, ops } = this.keyOps('account')
    await this.store.batch(ops)
    return issued
  }

  private async keysOf(agentId: string): Promise<KeyRecord[]> {
    const ids: string[] = []
    for await (const [, keyId] of this.agentKeys.entries({ gt: `${agentId}\x00`, lt: `${agentId}\x01` })) ids.push(keyId)
    return (await this.keys.getMany(ids)).filter((r): r is KeyRecord => !!r)
  }

  async listAgentKeys(agentId: string): Promise<KeyRecord[]> {
    await this.requireAgent(agentId)
    return this.keysOf(agentId)
  }

  async listAccountKeys(): Promise<KeyRecord[]> {
    const out: KeyRecord[] = []
    for await (const [, rec] of this.keys.entries()) if (rec.kind === 'account') out.push(rec)
    return out
  }

  /**
   * Moves when a key revoke or an agent delete is written (before `onAgentDelete`'s hooks run):
   * a cache that read before it moved must not keep what it read.
   */
  get revision(): number {
    return this.revoked
  }

  /** Drop these keys from the cache once their revoke or delete is written. */
  private forget(hashes: string[]): void {
    for (const h of hashes) this.cache.delete(h)
    this.revoked++
  }

  /** Revoke a key at once. The last active account key cannot be revoked (nobody could log in). */
  async revokeKey(keyId: string): Promise<KeyRecord> {
    return exclusive(this.store, 'registry:keys', async () => {
      const rec = await this.keys.get(keyId)
      if (!rec) throw notFound(`key ${keyId}`)
      if (rec.revokedAt) return rec
      if (rec.kind === 'account') {
        const active = (await this.listAccountKeys()).filter((k) => !k.revokedAt)
        if (active.length <= 1 && !this.envKeyHash) {
          throw new PaygateError('conflict', 'this is the last active account key; issue another before revoking it')
        }
      }
      const updated: KeyRecord = { ...rec, revokedAt: this.nowIso() }
      await this.store.batch([
        { type: 'put', coll: this.keys, key: keyId, value: updated },
        { type: 'del', coll: this.keyByHash, key: rec.hash },
      ])
      this.forget([rec.hash])
      return updated
    })
  }

  // ---- agents -------------------------------------------------------------------------

  /** Run `fn` for an existing agent under its lock: no delete or other change of it interleaves. */
  async withAgent<T>(agentId: string, fn: (agent: AgentRecord) => Promise<T>): Promise<T> {
    return exclusive(this.store, `registry:agent:${agentId}`, async () => fn(await this.requireAgent(agentId)))
  }

  /**
   * Run `fn` for the agent under its lock, creating it if it does not exist (a client written
   * from the spec creates agents through `POST /v1/wallets` and `PUT /v1/policies/<id>`): `fn`
   * gets the op that stores a new agent (none for an existing one) and writes it in the same
   * batch as its own change, so a change that fails leaves no agent behind. The agent-id
   * rules and reserved ids apply. `create: false`: as `withAgent` (404 for a missing agent). The agent gets no key: `POST /v1/agents/<id>/keys` issues one.
   */
  async withAgentOrNew<T>(agentId: string, fn: (agent: AgentRecord, create: BatchOp[]) => Promise<T>, opts: { create?: boolean } = {}): Promise<T> {
    if (opts.create === false) return this.withAgent(agentId, (a) => fn(a, []))
    validateAgentId(agentId)
    return exclusive(this.store, `registry:agent:${agentId}`, async () => {
      const found = await this.getAgent(agentId)
      if (found) return fn(found, [])
      const agent: AgentRecord = { agentId, createdAt: this.nowIso() }
      return fn(agent, [{ type: 'put', coll: this.agents, key: agentId, value: agent }])
    })
  }

  async requireAgent(agentId: string): Promise<AgentRecord> {
    const a = await this.getAgent(agentId)
    if (!a) throw notFound(`agent ${agentId}`)
    return a
  }

  /** The agent if it is in memory (no store read): hot paths try this before `getAgent`. */
  cachedAgent(agentId: string): AgentRecord | undefined {
    return this.agentCache.get(agentId)
  }

  async getAgent(agentId: string): Promise<AgentRecord | undefined> {
    const hit = this.agentCache.get(agentId)
    if (hit) return hit
    if (!AGENT_ID_RE.test(agentId)) return undefined
    const { value: a, cacheable } = await this.readGuarded(() => this.agents.get(agentId))
    if (a && cacheable && this.caching) this.agentCache.set(agentId, a)
    return a
  }

  async createAgent(requested?: string): Promise<{ agent: AgentRecord; key: IssuedKey }> {
    const agentId = requested === undefined ? `agent_${randomBase62(12)}` : validateAgentId(requested)
    return exclusive(this.store, `registry:agent:${agentId}`, async () => {
      if (await this.agents.get(agentId)) throw new PaygateError('conflict', `agent ${agentId} already exists`)
      const agent: AgentRecord = { agentId, createdAt: this.nowIso() }
      const { issued, ops } = this.keyOps('agent', agentId)
      await this.store.batch([{ type: 'put', coll: this.agents, key: agentId, value: agent }, ...ops])
      return { agent, key: issued }
    })
  }

  async listAgents(opts: { limit: number; cursor?: string }): Promise<{ agents: AgentRecord[]; nextCursor: string | null }> {
    const agents: AgentRecord[] = []
    for await (const [, a] of this.agents.entries({ ...(opts.cursor ? { gt: opts.cursor } : {}), limit: opts.limit + 1 })) agents.push(a)
    const more = agents.length > opts.limit
    if (more) agents.pop()
    return { agents, nextCursor: more ? agents[agents.length - 1]!.agentId : null }
  }

  /** Delete an agent, its keys (which stop working at once) and everything cascaded to it. */
  async deleteAgent(agentId: string): Promise<void> {
    await this.withAgent(agentId, async () => {
      const keys = await this.keysOf(agentId)
      const ops: BatchOp[] = [{ type: 'del', coll: this.agents, key: agentId }]
      for (const k of keys) {
        ops.push({ type: 'del', coll: this.keys, key: k.keyId })
        ops.push({ type: 'del', coll: this.keyByHash, key: k.hash })
        ops.push({ type: 'del', coll: this.agentKeys, key: `${agentId}\x00${k.keyId}` })
      }
      for (const c of this.cascades) ops.push(...(await c(agentId)))
      await this.store.batch(ops)
      this.agentCache.delete(agentId)
      this.forget(keys.map((k) => k.hash))
      for (const d of this.deleted) d(agentId)
    })
  }

  // ---- bootstrap ----------------------------------------------------------------------

  /**
   * On first start, create an account key and write it to a 0600 file in the data
   * directory. A key file whose key the store has no record of (e.g. state wiped) is
   * re-registered so the operator's key keeps working; a revoked key never comes back:
   * with no active account key left, a new one replaces it in the file (`created`).
   */
  async bootstrapAccountKey(dataDir: string): Promise<{ file: string; created: boolean; apiKey: string | null }> {
    const file = join(dataDir, ACCOUNT_KEY_FILE)
    const known = await this.listAccountKeys()
    if (known.some((k) => !k.revokedAt)) return { file, created: false, apiKey: null }
    const inFile = existsSync(file) ? readFileSync(file, 'utf8').trim() : ''
    if (keyKindOf(inFile) === 'account') {
      const hash = hashKey(inFile)
      if (!known.some((k) => sameHash(k.hash, hash))) {
        const rec: KeyRecord = { keyId: newKeyId(), kind: 'account', hash, prefix: displayPrefix(inFile), createdAt: this.nowIso() }
        await this.store.batch([
          { type: 'put', coll: this.keys, key: rec.keyId, value: rec },
          { type: 'put', coll: this.keyByHash, key: rec.hash, value: rec.keyId },
        ])
        return { file, created: false, apiKey: null }
      }
    }
    // The file first: a crash before the store write leaves a key file that the next start registers.
    const { issued, ops } = this.keyOps('account')
    const tmp = `${file}.tmp`
    writeFileSync(tmp, `${issued.apiKey}\n`, { mode: 0o600 })
    chmodSync(tmp, 0o600)
    renameSync(tmp, file)
    await this.store.batch(ops)
    return { file, created: true, apiKey: issued.apiKey }
  }
}
