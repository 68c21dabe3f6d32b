import { createPrivateKey, generateKeyPair, type KeyObject, X509Certificate } from 'node:crypto'
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import forge from 'node-forge'
import { PaygateError } from '../errors/index.js'
import type { Logger } from '../log/index.js'
import { selfSignedCa } from './ca-x509.js'

/**
 * The CA's files on disk: `ca.key` + `ca.pem` are created on first start and reused
 * afterwards; one leaf key (`leaf.key`) serves every intercepted host. Keys come from
 * `node:crypto.generateKeyPair` (off the event loop).
 */

const CA_KEY_FILE = 'ca.key'
const CA_CERT_FILE = 'ca.pem'
const LEAF_KEY_FILE = 'leaf.key'

export interface CaFiles {
  caKey: string
  caCert: string
  leafKey: string
}

/** The CA and leaf key as read (or just created) from a certificate directory. */
export interface CaMaterial {
  certPem: string
  caKey: KeyObject
  caX509: X509Certificate
  caForge: forge.pki.Certificate
  leafKeyPem: string
  leafKey: KeyObject
  files: CaFiles
  /** What this load created: false means the file was already there and reused. */
  created: { ca: boolean; leafKey: boolean }
}

/**
 * The CA files of `certsDir` when a CA is there (not creating one): what `paygate copy-store`
 * takes into the database. `undefined` when `ca.key` and `ca.pem` are both absent.
 */
export async function readCaFiles(certsDir: string, now: () => number, log: Logger | undefined): Promise<CaMaterial | undefined> {
  if (!existsSync(join(certsDir, CA_KEY_FILE)) && !existsSync(join(certsDir, CA_CERT_FILE))) return undefined
  return loadCaMaterial(certsDir, now, log)
}

/**
 * Read the CA from `certsDir`, creating `ca.key` (0600), `ca.pem` and `leaf.key` (0600)
 * when absent. A partial or broken set throws `invalid_config` naming the files.
 */
export async function loadCaMaterial(certsDir: string, now: () => number, log: Logger | undefined): Promise<CaMaterial> {
  const files = { caKey: join(certsDir, CA_KEY_FILE), caCert: join(certsDir, CA_CERT_FILE), leafKey: join(certsDir, LEAF_KEY_FILE) }
  try {
    mkdirSync(certsDir, { recursive: true, mode: 0o700 })
  } catch (e) {
    throw new PaygateError('invalid_config', `the certificate directory ${certsDir} cannot be created: ${(e as Error).message}`)
  }

  const hasKey = existsSync(files.caKey)
  const hasCert = existsSync(files.caCert)
  if (hasKey !== hasCert) {
    const [present, missing] = hasKey ? [files.caKey, files.caCert] : [files.caCert, files.caKey]
    throw new PaygateError('invalid_config', `${present} exists but ${missing} is missing: restore it, or delete both to create a new CA (clients that trust the old CA must then fetch the new one)`)
  }
  const created = { ca: !hasKey, leafKey: !existsSync(files.leafKey) }

  // Both key generations (when needed) run in parallel on the libuv pool.
  const [newCaKey, newLeafKey] = await Promise.all([created.ca ? newRsaKey() : null, created.leafKey ? newRsaKey() : null])

  let caKey: KeyObject
  let certPem: string
  if (newCaKey) {
    caKey = newCaKey
    certPem = selfSignedCa(caKey, now())
    writeAtomic(files.caKey, caKey.export({ type: 'pkcs8', format: 'pem' }) as string, 0o600)
    writeAtomic(files.caCert, certPem, 0o644)
  } else {
    caKey = readRsaKey(files.caKey, `the CA key ${files.caKey}`, log).key
    certPem = readText(files.caCert, `the CA certificate ${files.caCert}`)
  }
  const { x509: caX509, forgeCert: caForge } = parseCa(certPem, caKey, files, now())

  let leafKeyPem: string
  let leafKey: KeyObject
  if (newLeafKey) {
    leafKey = newLeafKey
    leafKeyPem = leafKey.export({ type: 'pkcs8', format: 'pem' }) as string
    writeAtomic(files.leafKey, leafKeyPem, 0o600)
  } else {
    ;({ key: leafKey, pem: leafKeyPem } = readRsaKey(files.leafKey, `the leaf key ${files.leafKey}`, log))
  }
  return { certPem, caKey, caX509, caForge, leafKeyPem, leafKey, files, created }
}

export function newRsaKey(): Promise<KeyObject> {
  return new Promise((resolve, reject) => {
    generateKeyPair('rsa', { modulusLength: 2048, publicExponent: 0x10001 }, (err, _pub, priv) => (err ? reject(err) : resolve(priv)))
  })
}

function readText(file: string, what: string): string {
  try {
    return readFileSync(file, 'utf8')
  } catch (e) {
    throw new PaygateError('invalid_config', `${what} cannot be read: ${(e as Error).message}`)
  }
}

function readRsaKey(file: string, what: string, log: Logger | undefined): { key: KeyObject; pem: string } {
  const text = readText(file, what)
  let key: KeyObject
  try {
    key = createPrivateKey(text)
  } catch (e) {
    throw new PaygateError('invalid_config', `${what} is not a readable PEM private key (${(e as Error).message}); restore it, or delete the files in its directory to create new ones`)
  }
  if (key.asymmetricKeyType !== 'rsa') throw new PaygateError('invalid_config', `${what} is a ${key.asymmetricKeyType ?? 'unknown'} key; Paygate needs an RSA key`)
  const mode = statSync(file).mode & 0o777
  if (mode & 0o077) log?.warn({ file, mode: mode.toString(8) }, 'a private key file is readable by other users; chmod 600 it')
  return { key, pem: text }
}

/** Write through a temp file and rename, so a crash never leaves half a key. */
function writeAtomic(file: string, text: string, mode: number): void {
  const tmp = `${file}.${process.pid}.tmp`
  writeFileSync(tmp, text, { mode })
  chmodSync(tmp, mode)
  renameSync(tmp, file)
}

export function parseCa(certPem: string, caKey: KeyObject, files: CaFiles, now: number): { x509: X509Certificate; forgeCert: forge.pki.Certificate } {
  let x509: X509Certificate
  let forgeCert: forge.pki.Certificate
  try {
    x509 = new X509Certificate(certPem)
    forgeCert = forge.pki.certificateFromPem(certPem)
  } catch (e) {
    throw new PaygateError(
      'invalid_config',
      `the CA certificate ${files.caCert} is not a readable RSA PEM certificate (${(e as Error).message}); restore it, or delete ${files.caKey} and ${files.caCert} to create a new CA`,
    )
  }
  if (!x509.checkPrivateKey(caKey)) {
    throw new PaygateError('invalid_config', `${files.caKey} is not the key of ${files.caCert}: restore the matching pair, or delete both to create a new CA`)
  }
  if (!x509.ca) throw new PaygateError('invalid_config', `${files.caCert} is not a CA certificate (basicConstraints CA:TRUE is missing)`)
  if (Date.parse(x509.validTo) <= now) {
    throw new PaygateError(
      'invalid_config',
      `the CA certificate ${files.caCert} expired on ${new Date(x509.validTo).toISOString()}: delete ${files.caKey} and ${files.caCert} to create a new CA, then redistribute it`,
    )
  }
  return { x509, forgeCert }
}
