import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto'
import { chmodSync, existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { decodeMasterKey } from '../config/keys.js'
import { PaygateError } from '../errors/index.js'
import type { Collection } from '../store/index.js'

const FILE = 'master-key'
/** A new key's name until the start that made it succeeds (`commit`); a failed start's is taken up by the next. */
const PENDING = 'master-key.new'
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
   * 0600 on first start, under a temporary name until `commit`, which the caller runs once
   * its start has succeeded: a failed first start leaves no `master-key` behind, and the
   * next start takes up the pending key it made, which the store's check was written
   * with). A key that cannot open what this data directory already holds stops the start
   * with a clear message.
   */
  static async open(dataDir: string, configured: string | null, meta: Collection<string>): Promise<{ keystore: Keystore; source: 'config' | 'file'; created: boolean; commit: () => void }> {
    let key: Buffer
    let source: 'config' | 'file' = 'config'
    let created = false
    let commit = (): void => {}
    const file = join(dataDir, FILE)
    if (configured) key = decodeMasterKey(configured)!
    else {
      source = 'file'
      const pending = join(dataDir, PENDING)
      const found = existsSync(file) ? file : existsSync(pending) ? pending : null
      if (found) {
        const k = decodeMasterKey(readFileSync(found, 'utf8').trim())
        if (!k) throw new PaygateError('invalid_config', `${found} does not hold a 32-byte master key (64 hex characters)`)
        key = k
      } else {
        key = randomBytes(32)
        writeFileSync(pending, `${key.toString('hex')}\n`, { mode: 0o600 })
        chmodSync(pending, 0o600)
        created = true
      }
      if (found !== file) commit = () => renameSync(pending, file)
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
    return { keystore: ks, source, created, commit }
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
