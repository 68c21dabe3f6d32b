import { randomBytes } from 'node:crypto'
import { hideInLogs } from '../log/index.js'
import type { Collection, Store } from '../store/index.js'
import type { Keystore } from '../wallet/keystore.js'

const KEY = 'webhookSecret'
/** The GCM additional data: the stored secret opens only as this one. */
const CONTEXT = 'notify:webhookSecret'

const newSecret = (): string => `whsec_${randomBytes(32).toString('base64url')}`

/**
 * The account's webhook signing secret: encrypted at rest with the wallet keys' master key
 * (wallet/keystore.ts), decrypted once into memory, registered with the logger's scrubber
 * so it never reaches a log line. Created on first use; rotation takes effect at once.
 * Replicas on one database: it is read (and decrypted) at each use instead of held, so a
 * rotation through any replica is used by all from their next delivery, and the first use
 * creates it under a database lock, so replicas starting together sign with one secret.
 */
export class WebhookSecret {
  private readonly coll: Collection<string>
  private current: string | null = null
  private loading: Promise<string> | null = null

  private readonly shared: boolean

  constructor(
    private readonly store: Store,
    private readonly keystore: Keystore,
  ) {
    this.coll = store.collection('notifySettings')
    this.shared = store.backend === 'postgres'
  }

  get(): Promise<string> {
    if (this.shared) return this.readShared()
    if (this.current) return Promise.resolve(this.current)
    // One read (or creation) however many callers ask at once.
    this.loading ??= (async () => {
      const blob = await this.coll.get(KEY)
      if (blob === undefined) return this.rotate()
      return this.hold(this.keystore.decrypt(blob, CONTEXT).toString('utf8'))
    })().finally(() => {
      this.loading = null
    })
    return this.loading
  }

  /** Replicas: the stored secret, created under the lock when there is none. */
  private async readShared(): Promise<string> {
    const stored = await this.coll.get(KEY)
    if (stored !== undefined) return this.hold(this.keystore.decrypt(stored, CONTEXT).toString('utf8'))
    const { result, written } = await this.store.transact('notify\u0000webhookSecret', async () => {
      const blob = await this.coll.get(KEY)
      if (blob !== undefined) return { ops: [], result: this.keystore.decrypt(blob, CONTEXT).toString('utf8') }
      const s = newSecret()
      return { ops: [{ type: 'put' as const, coll: this.coll as Collection<unknown>, key: KEY, value: this.keystore.encrypt(Buffer.from(s, 'utf8'), CONTEXT) }], result: s }
    })
    const w = await written
    if (!w.ok) throw w.error
    return this.hold(result)
  }

  async rotate(): Promise<string> {
    const s = newSecret()
    await this.coll.put(KEY, this.keystore.encrypt(Buffer.from(s, 'utf8'), CONTEXT))
    return this.hold(s)
  }

  private hold(s: string): string {
    if (s !== this.current) hideInLogs(s)
    this.current = s
    return s
  }
}
