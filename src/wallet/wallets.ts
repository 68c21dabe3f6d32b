import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from 'viem/accounts'
import type { Registry } from '../agents/registry.js'
import { PaygateError, notFound } from '../errors/index.js'
import type { BatchOp, Collection, Store } from '../store/index.js'
import type { Clock } from '../util/clock.js'
import { FastSigner } from '../crypto/secp256k1.js'
import type { Keystore } from './keystore.js'

export interface WalletRecord {
  agentId: string
  address: `0x${string}`
  /** The secp256k1 private key, AES-256-GCM under the master key. */
  encryptedKey: string
  createdAt: string
}

const context = (agentId: string, address: string): string => `wallet:${agentId}:${address.toLowerCase()}`

/**
 * One wallet per agent: a fresh secp256k1 key, stored encrypted. Deleting an agent moves
 * its wallet to an archive (keyed by address) instead of destroying a key that may hold
 * funds. Decrypted native signers are kept in memory for the payment hot path.
 */
export class Wallets {
  private readonly wallets: Collection<WalletRecord>
  private readonly archive: Collection<WalletRecord>
  private readonly signers = new Map<string, FastSigner>()
  private readonly records = new Map<string, WalletRecord>()
  /**
   * On a store shared by replicas another process may delete an agent and recreate it with a
   * new wallet: wallet records are then read each time, and a decrypted signer is reused only
   * for the address the record names.
   */
  private readonly caching: boolean

  constructor(
    private readonly store: Store,
    private readonly registry: Registry,
    private readonly keystore: Keystore,
    private readonly clock: Clock,
  ) {
    this.wallets = store.collection('wallets')
    this.archive = store.collection('walletArchive')
    this.caching = store.backend !== 'postgres'
    registry.onAgentDelete(
      async (agentId): Promise<BatchOp[]> => {
        const w = await this.wallets.get(agentId)
        if (!w) return []
        return [
          { type: 'del', coll: this.wallets, key: agentId },
          { type: 'put', coll: this.archive, key: `${w.address.toLowerCase()}`, value: w },
        ]
      },
      // Only once the delete is written: cleared earlier, a concurrent read would cache the old
      // wallet again, and an agent recreated under the same id would pay from it.
      (agentId) => {
        this.signers.delete(agentId)
        this.records.delete(agentId)
      },
    )
  }

  /** A new wallet for the agent; `createAgent`: the agent too when it does not exist (in the same write). */
  async create(agentId: string, opts: { createAgent?: boolean } = {}): Promise<WalletRecord> {
    return this.registry.withAgentOrNew(
      agentId,
      async (_agent, createAgent) => {
        if (await this.wallets.get(agentId)) throw new PaygateError('conflict', `agent ${agentId} already has a wallet`)
        const pk = generatePrivateKey()
        const account = privateKeyToAccount(pk)
        const rec: WalletRecord = {
          agentId,
          address: account.address,
          encryptedKey: this.keystore.encrypt(Buffer.from(pk.slice(2), 'hex'), context(agentId, account.address)),
          createdAt: new Date(this.clock.now()).toISOString(),
        }
        await this.store.batch([...createAgent, { type: 'put', coll: this.wallets, key: agentId, value: rec }])
        return rec
      },
      { create: opts.createAgent === true },
    )
  }

  async get(agentId: string): Promise<WalletRecord | undefined> {
    const hit = this.records.get(agentId)
    if (hit) return hit
    const revision = this.registry.revision
    const w = await this.wallets.get(agentId)
    if (w && revision === this.registry.revision && this.caching) this.records.set(agentId, w)
    return w
  }

  /** The agent's wallet, or 404 naming what is missing (the agent, or its wallet). */
  async require(agentId: string): Promise<WalletRecord> {
    const w = await this.get(agentId)
    if (w) return w
    await this.registry.requireAgent(agentId)
    throw notFound(`a wallet for agent ${agentId}`)
  }

  private async privateKey(agentId: string): Promise<{ w: WalletRecord; pk: `0x${string}` }> {
    const w = await this.require(agentId)
    const pk = `0x${this.keystore.decrypt(w.encryptedKey, context(agentId, w.address)).toString('hex')}` as const
    return { w, pk }
  }

  /** The agent's signing account (viem), decrypted on each call: the paid path uses `signer`. */
  async account(agentId: string): Promise<PrivateKeyAccount> {
    const { w, pk } = await this.privateKey(agentId)
    const account = privateKeyToAccount(pk)
    if (account.address !== w.address) throw new PaygateError('internal_error', `stored wallet key of ${agentId} does not match its address`)
    return account
  }

  /** The agent's native signer (the payment hot path), decrypted once and cached. */
  async signer(agentId: string): Promise<FastSigner> {
    const hit = this.signers.get(agentId)
    if (hit && (this.caching || hit.address === (await this.require(agentId)).address)) return hit
    const revision = this.registry.revision
    const { w, pk } = await this.privateKey(agentId)
    const signer = new FastSigner(pk)
    if (signer.address !== w.address) throw new PaygateError('internal_error', `stored wallet key of ${agentId} does not match its address`)
    if (revision === this.registry.revision) this.signers.set(agentId, signer)
    return signer
  }
}
