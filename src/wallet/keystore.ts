import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto'
import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { decodeMasterKey } from '../config/keys.js'
import { PaygateError } from '../errors/index.js'
import type { Collection } from '../store/index.js'

const FILE = 'master-key'
const CHECK_KEY = 'masterKeyCheck'
const CHECK_TEXT = 'paygate master key check v1'
const VERSION = 'v1'

/**
 * Encrypts secrets at rest (wallet keys, the chain signer key) with AES-256-GCM under a
 * 32-byte master key. Each ciphertext is bound to what it belongs to through the GCM
 * additional data, so a stored key cannot be swapped onto another record.
 */
export class Keystore {
  private constructor(private readonly key: Buffer) {}

  /**
   * The master key from config (PAYGATE_MASTER_KEY), else `<dataDir>/master-key` (created
   * 0600 on first start). A key that cannot open what this data directory already holds
   * stops the start with a clear message.
   */
  static async open(dataDir: string, configured: string | null, meta: Collection<string>): Promise<{ keystore: Keystore; source: 'config' | 'file'; created: boolean }> {
    let key: Buffer
    let source: 'config' | 'file'
    let created = false
    const file = join(dataDir, FILE)
    if (configured) {
      key = decodeMasterKey(configured)!
      source = 'config'
    } else {
      source = 'file'
      if (existsSync(file)) {
        const k = decodeMasterKey(readFileSync(file, 'utf8').trim())
        if (!k) throw new PaygateError('invalid_config', `${file} does not hold a 32-byte master key (64 hex characters)`)
        key = k
      } else {
        key = randomBytes(32)
        writeFileSync(file, `${key.toString('hex')}\n`, { mode: 0o600 })
        chmodSync(file, 0o600)
        created = true
      }
    }
    const ks = new Keystore(key)
    const check = await meta.get(CHECK_KEY)
    if (check === undefined) await meta.put(CHECK_KEY, ks.encrypt(Buffer.from(CHECK_TEXT), CHECK_KEY))
    else {
      let ok = false
      try {
        ok = ks.decrypt(check, CHECK_KEY).toString() === CHECK_TEXT
      } catch {
        ok = false
      }
      if (!ok) {
        throw new PaygateError(
          'invalid_config',
          `the master key (${source === 'config' ? 'PAYGATE_MASTER_KEY' : file}) cannot decrypt the wallet keys stored in ${dataDir}; use the master key they were encrypted with`,
        )
      }
    }
    return { keystore: ks, source, created }
  }

  /** `v1.<iv>.<tag>.<ciphertext>` in base64url; `context` is authenticated, not stored. */
  encrypt(plaintext: Buffer, context: string): string {
    const iv = randomBytes(12)
    const c = createCipheriv('aes-256-gcm', this.key, iv)
    c.setAAD(Buffer.from(context))
    const ct = Buffer.concat([c.update(plaintext), c.final()])
    return [VERSION, iv.toString('base64url'), c.getAuthTag().toString('base64url'), ct.toString('base64url')].join('.')
  }

  decrypt(blob: string, context: string): Buffer {
    const [v, iv, tag, ct] = blob.split('.')
    if (v !== VERSION || !iv || !tag || ct === undefined) throw new PaygateError('internal_error', 'unreadable encrypted secret')
    const d = createDecipheriv('aes-256-gcm', this.key, Buffer.from(iv, 'base64url'))
    d.setAAD(Buffer.from(context))
    d.setAuthTag(Buffer.from(tag, 'base64url'))
    return Buffer.concat([d.update(Buffer.from(ct, 'base64url')), d.final()])
  }
}
