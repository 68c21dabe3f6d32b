import { createPrivateKey, type KeyObject } from 'node:crypto'
import { PaygateError } from '../errors/index.js'
import type { Collection } from '../store/index.js'
import type { CaFiles, CaMaterial } from './ca-files.js'
import { newRsaKey, parseCa } from './ca-files.js'
import { selfSignedCa } from './ca-x509.js'

/**
 * The interception CA kept in the store instead of `certsDir` (PostgreSQL: every replica
 * serves leaves of one CA, so agents trust one CA whichever replica they reach). One entry,
 * `ca/authority`: the certificate in PEM and both private keys (the CA's and the shared leaf
 * key) encrypted under the master key, as wallet keys are, each bound to its field. The first
 * replica creates it, under the store's initialisation lock (the caller holds it).
 */
export const CA_COLLECTION = 'ca'
export const CA_ENTRY = 'authority'

export interface StoredCa {
  certPem: string
  /** PKCS#8 PEM, encrypted (`Sealer.encrypt`, context `ca/authority/caKey`). */
  caKey: string
  /** PKCS#8 PEM, encrypted (context `ca/authority/leafKey`). */
  leafKey: string
  createdAt: string
}

/** What encrypts secrets at rest (the Keystore). */
export interface Sealer {
  encrypt(plaintext: Buffer, context: string): string
  decrypt(blob: string, context: string): Buffer
}

const context = (field: 'caKey' | 'leafKey'): string => `${CA_COLLECTION}/${CA_ENTRY}/${field}`
const pem = (k: KeyObject): string => k.export({ type: 'pkcs8', format: 'pem' }) as string

/** Where the stored CA is, in the place of file names (log lines and error messages). */
export const STORED_CA_FILES: CaFiles = {
  caKey: `the store's ${CA_COLLECTION}/${CA_ENTRY} (caKey)`,
  caCert: `the store's ${CA_COLLECTION}/${CA_ENTRY} (certPem)`,
  leafKey: `the store's ${CA_COLLECTION}/${CA_ENTRY} (leafKey)`,
}

/** The stored form of a CA: keys encrypted. */
export function sealCa(m: { certPem: string; caKey: KeyObject; leafKey: KeyObject }, sealer: Sealer, now: number): StoredCa {
  return {
    certPem: m.certPem,
    caKey: sealer.encrypt(Buffer.from(pem(m.caKey)), context('caKey')),
    leafKey: sealer.encrypt(Buffer.from(pem(m.leafKey)), context('leafKey')),
    createdAt: new Date(now).toISOString(),
  }
}

function openKey(stored: StoredCa, field: 'caKey' | 'leafKey', sealer: Sealer): { key: KeyObject; pem: string } {
  let text: string
  try {
    text = sealer.decrypt(stored[field], context(field)).toString('utf8')
  } catch {
    throw new PaygateError('invalid_config', `${STORED_CA_FILES[field]} cannot be decrypted with this master key: every replica needs the same masterKey`)
  }
  return { key: createPrivateKey(text), pem: text }
}

/**
 * The CA from the store, created (and stored) when absent. Call it holding the store's
 * initialisation lock, so replicas starting together create one CA.
 */
export async function loadStoredCaMaterial(coll: Collection<StoredCa>, sealer: Sealer, now: () => number): Promise<CaMaterial> {
  const stored = await coll.get(CA_ENTRY)
  const files = STORED_CA_FILES
  if (!stored) {
    const [caKey, leafKey] = await Promise.all([newRsaKey(), newRsaKey()])
    const certPem = selfSignedCa(caKey, now())
    await coll.put(CA_ENTRY, sealCa({ certPem, caKey, leafKey }, sealer, now()))
    const { x509: caX509, forgeCert: caForge } = parseCa(certPem, caKey, files, now())
    return { certPem, caKey, caX509, caForge, leafKeyPem: pem(leafKey), leafKey, files, created: { ca: true, leafKey: true } }
  }
  const { key: caKey } = openKey(stored, 'caKey', sealer)
  const { key: leafKey, pem: leafKeyPem } = openKey(stored, 'leafKey', sealer)
  const { x509: caX509, forgeCert: caForge } = parseCa(stored.certPem, caKey, files, now())
  return { certPem: stored.certPem, caKey, caX509, caForge, leafKeyPem, leafKey, files, created: { ca: false, leafKey: false } }
}
