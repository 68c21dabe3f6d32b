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
 */
export class WebhookSecret {
  private readonly coll: Collection<string>
  private current: string | null = null
  private loading: Promise<string> | null = null

  constructor(
    store: Store,
    private readonly keystore: Keystore,
  ) {
    this.coll = store.collection('notifySettings')
  }

  get(): Promise<string> {
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

  async rotate(): Promise<string> {
    const s = newSecret()
    await this.coll.put(KEY, this.keystore.encrypt(Buffer.from(s, 'utf8'), CONTEXT))
    return this.hold(s)
  }

  private hold(s: string): string {
    hideInLogs(s)
    this.current = s
    return s
  }
}
