import { X509Certificate, createHash, createPrivateKey, createPublicKey, generateKeyPair, randomBytes, sign, type KeyObject } from 'node:crypto'
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs'
import { isIPv4, isIPv6 } from 'node:net'
import { join } from 'node:path'
import { createSecureContext, rootCertificates, type SecureContext } from 'node:tls'
import forge from 'node-forge'
import { PaygateError } from '../errors/index.js'
import type { Logger } from '../log/index.js'
import { systemClock, type Clock } from '../util/clock.js'
import { randomBase62 } from '../util/random.js'

/**
 * Paygate's interception CA (node-forge lives only in src/proxy/).
 *
 * `certs/ca.key` + `certs/ca.pem` are created on first start and reused afterwards; one
 * leaf key (`certs/leaf.key`) serves every intercepted host. Keys come from
 * `node:crypto.generateKeyPair` (off the event loop); forge only lays out the
 * TBSCertificate, and the RSA-SHA256 signature goes through `node:crypto.sign`, so a
 * new leaf costs well under a millisecond. Leaves are cached per host (LRU).
 */

const CA_KEY_FILE = 'ca.key'
const CA_CERT_FILE = 'ca.pem'
const LEAF_KEY_FILE = 'leaf.key'

const HOUR = 3_600_000
const DAY = 24 * HOUR
const CA_VALIDITY_DAYS = 3650
/** Leaves live a year (well under the 398-day browser limit) and never past the CA. */
const LEAF_VALIDITY_DAYS = 365
/** A cached leaf this close to its notAfter is minted again. */
const RENEW_BEFORE_MS = DAY
/** Warn at start when the CA has less than this left. */
const CA_EXPIRY_WARNING_MS = 30 * DAY
const DEFAULT_CACHE_SIZE = 1000
/** X.520 ub-common-name: longer names go only into the SAN. */
const MAX_CN_LENGTH = 64

const SHA256_WITH_RSA = '1.2.840.113549.1.1.11'
/** AlgorithmIdentifier { sha256WithRSAEncryption, NULL } in DER. */
const SHA256_WITH_RSA_ALG_DER = Buffer.from('300d06092a864886f70d01010b0500', 'hex')
const UTF8 = forge.asn1.Type.UTF8 as unknown as forge.asn1.Class // the typings call valueTagClass a Class; it is a Type

/** forge implements this but its typings omit it. */
const getTBSCertificate = (forge.pki as unknown as { getTBSCertificate(c: forge.pki.Certificate): forge.asn1.Asn1 }).getTBSCertificate

export interface CaOptions {
  log?: Logger
  /** Leaf certificates kept (LRU). Default 1000. */
  cacheSize?: number
  clock?: Clock
}

export interface CaStats {
  hits: number
  /** Leaves minted: first sight of a host, evicted hosts, and renewals of near-expiry leaves. */
  misses: number
  size: number
  capacity: number
}

export interface Leaf {
  /** The leaf certificate, PEM. */
  cert: string
  /** The shared leaf private key, PEM (PKCS#8). */
  key: string
}

interface Entry {
  cert: string
  notAfter: number
  context: SecureContext | null
}

/** A CONNECT/SNI host reduced to what goes into a certificate. */
interface Target {
  /** Cache key and CN: lower-case name, or the canonical IP text. */
  name: string
  /** The 4 or 16 address bytes for an IP SAN; null for a DNS name. */
  ip: Buffer | null
}

export class CertificateAuthority {
  /** The CA certificate, PEM: what `/v1/ca.pem` serves and clients trust. */
  readonly certPem: string
  /** The leaf private key shared by every minted leaf, PEM. */
  readonly leafKeyPem: string
  /** SHA-256 fingerprint of the CA certificate (`AB:CD:...`). */
  readonly fingerprint256: string
  /** The CA's subject (`CN=...`), for logs and the CLI. */
  readonly subject: string
  readonly validTo: Date
  readonly files: { caKey: string; caCert: string; leafKey: string }
  /** What this load created: false means the file was already there and reused. */
  readonly created: { ca: boolean; leafKey: boolean }

  private readonly caKey: KeyObject
  private readonly caNotAfter: number
  /** The CA's subject Name as forge parsed it from the CA's own DER (the leaves' issuer, byte for byte). */
  private readonly caSubjectAsn1: forge.asn1.Asn1
  private readonly caKeyId: string | null
  private readonly leafPublic: forge.pki.rsa.PublicKey
  private readonly leafKeyIdAsn1: forge.asn1.Asn1
  private readonly clock: Clock
  private readonly capacity: number
  private readonly cache = new Map<string, Entry>()
  private hits = 0
  private misses = 0

  private constructor(init: {
    certPem: string
    caKey: KeyObject
    caX509: X509Certificate
    caForge: forge.pki.Certificate
    leafKeyPem: string
    leafKey: KeyObject
    files: CertificateAuthority['files']
    created: CertificateAuthority['created']
    clock: Clock
    capacity: number
  }) {
    this.certPem = init.certPem
    this.caKey = init.caKey
    this.leafKeyPem = init.leafKeyPem
    this.files = init.files
    this.created = init.created
    this.clock = init.clock
    this.capacity = init.capacity
    this.fingerprint256 = init.caX509.fingerprint256
    this.subject = init.caX509.subject.replace(/\n/g, ', ')
    this.validTo = new Date(init.caX509.validTo)
    this.caNotAfter = this.validTo.getTime()
    this.caSubjectAsn1 = subjectOf(init.caForge)
    const ski = init.caForge.getExtension('subjectKeyIdentifier') as { subjectKeyIdentifier?: string } | null
    this.caKeyId = ski?.subjectKeyIdentifier ? forge.util.hexToBytes(ski.subjectKeyIdentifier) : null
    const leafPublic = createPublicKey(init.leafKey)
    this.leafPublic = forge.pki.publicKeyFromPem(leafPublic.export({ type: 'spki', format: 'pem' }) as string)
    this.leafKeyIdAsn1 = keyIdAsn1(leafPublic)
  }

  /**
   * Load the CA from `certsDir`, creating `ca.key` (0600), `ca.pem` and `leaf.key` (0600)
   * when absent. A partial or broken set stops the start with an `invalid_config` error
   * naming the files.
   */
  static async load(certsDir: string, opts: CaOptions = {}): Promise<CertificateAuthority> {
    const clock = opts.clock ?? systemClock
    const capacity = opts.cacheSize ?? DEFAULT_CACHE_SIZE
    if (!Number.isInteger(capacity) || capacity < 1) throw new PaygateError('invalid_config', `the leaf certificate cache size must be a positive integer (got ${capacity})`)
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
    const hasLeafKey = existsSync(files.leafKey)
    const created = { ca: !hasKey, leafKey: !hasLeafKey }

    // Both key generations (when needed) run in parallel on the libuv pool.
    const [newCaKey, newLeafKey] = await Promise.all([created.ca ? newRsaKey() : null, created.leafKey ? newRsaKey() : null])

    let caKey: KeyObject
    let certPem: string
    if (newCaKey) {
      caKey = newCaKey
      certPem = selfSignedCa(caKey, clock.now())
      writeAtomic(files.caKey, caKey.export({ type: 'pkcs8', format: 'pem' }) as string, 0o600)
      writeAtomic(files.caCert, certPem, 0o644)
    } else {
      caKey = readRsaKey(files.caKey, `the CA key ${files.caKey}`, opts.log).key
      certPem = readText(files.caCert, `the CA certificate ${files.caCert}`)
    }
    const { x509: caX509, forgeCert: caForge } = parseCa(certPem, caKey, files, clock.now())

    let leafKeyPem: string
    let leafKey: KeyObject
    if (newLeafKey) {
      leafKey = newLeafKey
      leafKeyPem = leafKey.export({ type: 'pkcs8', format: 'pem' }) as string
      writeAtomic(files.leafKey, leafKeyPem, 0o600)
    } else {
      ;({ key: leafKey, pem: leafKeyPem } = readRsaKey(files.leafKey, `the leaf key ${files.leafKey}`, opts.log))
    }

    const ca = new CertificateAuthority({ certPem, caKey, caX509, caForge, leafKeyPem, leafKey, files, created, clock, capacity })
    ca.selfTest(caX509)

    const left = ca.caNotAfter - clock.now()
    if (left < CA_EXPIRY_WARNING_MS) {
      opts.log?.warn({ caCert: files.caCert, validTo: ca.validTo.toISOString() }, 'the interception CA expires soon: delete ca.key and ca.pem to create a new one, then redistribute it')
    }
    opts.log?.info(
      { certsDir, created: created.ca, subject: ca.subject, fingerprint256: ca.fingerprint256, validTo: ca.validTo.toISOString() },
      created.ca ? 'created the interception CA' : 'loaded the interception CA',
    )
    return ca
  }

  /** The leaf certificate for a hostname or IP literal (cached), with the shared leaf key. */
  leafFor(host: string): Leaf {
    return { cert: this.entryFor(host).cert, key: this.leafKeyPem }
  }

  /** A TLS context serving the leaf for `host` (cached with the leaf). */
  secureContextFor(host: string): SecureContext {
    const entry = this.entryFor(host)
    entry.context ??= createSecureContext({ key: this.leafKeyPem, cert: entry.cert })
    return entry.context
  }

  /** For `tls.createServer({ SNICallback })` / `new TLSSocket(..., { SNICallback })`. */
  readonly sniCallback = (servername: string, cb: (err: Error | null, ctx?: SecureContext) => void): void => {
    let ctx: SecureContext
    try {
      ctx = this.secureContextFor(servername)
    } catch (e) {
      cb(e as Error)
      return
    }
    cb(null, ctx)
  }

  stats(): CaStats {
    return { hits: this.hits, misses: this.misses, size: this.cache.size, capacity: this.capacity }
  }

  /**
   * A PEM bundle of Node's root certificates (`tls.rootCertificates`, the Mozilla set
   * Node ships) plus the Paygate CA, for clients whose CA variable replaces the roots
   * (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, `CURL_CA_BUNDLE`, ...).
   */
  bundle(): string {
    const roots = rootCertificates.map((pem) => pem.trim()).join('\n')
    return `${roots}\n# Paygate interception CA: ${this.subject}\n# SHA-256 ${this.fingerprint256}\n${this.certPem.trim()}\n`
  }

  private entryFor(host: string): Entry {
    const target = parseHost(host)
    const now = this.clock.now()
    const hit = this.cache.get(target.name)
    if (hit && now < hit.notAfter - RENEW_BEFORE_MS) {
      this.hits++
      this.cache.delete(target.name)
      this.cache.set(target.name, hit)
      return hit
    }
    this.misses++
    const entry = this.mint(target, now)
    this.cache.delete(target.name)
    this.cache.set(target.name, entry)
    while (this.cache.size > this.capacity) {
      const oldest = this.cache.keys().next().value
      if (oldest === undefined) break
      this.cache.delete(oldest)
    }
    return entry
  }

  private mint(target: Target, now: number): Entry {
    const notAfter = Math.min(now + LEAF_VALIDITY_DAYS * DAY, this.caNotAfter)
    if (notAfter <= now) throw new PaygateError('unavailable', `the interception CA ${this.files.caCert} has expired; delete ca.key and ca.pem to create a new one`)
    const cert = forge.pki.createCertificate()
    cert.publicKey = this.leafPublic
    cert.serialNumber = randomSerialHex()
    cert.validity.notBefore = new Date(now - HOUR)
    cert.validity.notAfter = new Date(notAfter)
    const longName = target.name.length > MAX_CN_LENGTH
    cert.setSubject(longName ? [] : [{ shortName: 'CN', value: target.name, valueTagClass: UTF8 }])
    cert.setIssuer([]) // replaced by the CA's own encoded subject below
    const exts: Record<string, unknown>[] = [
      { name: 'basicConstraints', cA: false, critical: true },
      { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
      { name: 'extKeyUsage', serverAuth: true },
      {
        name: 'subjectAltName',
        critical: longName, // an empty subject needs a critical SAN (RFC 5280 4.2.1.6)
        altNames: [target.ip ? { type: 7, value: target.ip.toString('binary') } : { type: 2, value: target.name }],
      },
      { name: 'subjectKeyIdentifier', value: this.leafKeyIdAsn1 },
    ]
    if (this.caKeyId) exts.push({ name: 'authorityKeyIdentifier', keyIdentifier: this.caKeyId })
    cert.setExtensions(exts)
    const der = signCertificate(cert, this.caSubjectAsn1, this.caKey)
    return { cert: toPem(der), notAfter, context: null }
  }

  /** Mint one leaf at start and check it chains, so a CA we cannot sign for fails now rather than per CONNECT. */
  private selfTest(caX509: X509Certificate): void {
    const leaf = new X509Certificate(this.mint({ name: 'paygate.invalid', ip: null }, this.clock.now()).cert)
    if (!leaf.checkIssued(caX509) || !leaf.verify(caX509.publicKey) || leaf.checkHost('paygate.invalid') === undefined) {
      throw new PaygateError('invalid_config', `leaf certificates signed with ${this.files.caKey} do not verify against ${this.files.caCert}`)
    }
  }
}

// ---- host names ----------------------------------------------------------------------

const LABEL_RE = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/

/** Normalise a CONNECT/SNI host (`Example.COM.`, `[::1]`, `127.0.0.1`) or refuse it. */
function parseHost(raw: string): Target {
  let h = raw.trim().toLowerCase()
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1)
  if (isIPv4(h)) return { name: h, ip: Buffer.from(h.split('.').map(Number)) }
  if (isIPv6(h) && !h.includes('%')) {
    const canonical = new URL(`http://[${h}]/`).hostname.slice(1, -1)
    return { name: canonical, ip: ipv6Bytes(canonical) }
  }
  if (h.endsWith('.')) h = h.slice(0, -1)
  if (h.length > 0 && h.length <= 253 && h.split('.').every((l) => LABEL_RE.test(l))) return { name: h, ip: null }
  throw new PaygateError('invalid_request', `cannot issue a certificate for host ${JSON.stringify(raw.slice(0, 300))}`, { field: 'host' })
}

/** The 16 bytes of a canonical (WHATWG URL) IPv6 text: hex groups, at most one `::`. */
function ipv6Bytes(canonical: string): Buffer {
  const [head = '', tail] = canonical.split('::')
  const groups = (s: string | undefined): string[] => (s ? s.split(':') : [])
  const left = groups(head)
  const right = groups(tail)
  const all = tail === undefined ? left : [...left, ...Array<string>(8 - left.length - right.length).fill('0'), ...right]
  const out = Buffer.alloc(16)
  all.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), i * 2))
  return out
}

// ---- keys and files --------------------------------------------------------------------

function newRsaKey(): Promise<KeyObject> {
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

// ---- certificates ----------------------------------------------------------------------

function parseCa(certPem: string, caKey: KeyObject, files: CertificateAuthority['files'], now: number): { x509: X509Certificate; forgeCert: forge.pki.Certificate } {
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

function selfSignedCa(key: KeyObject, now: number): string {
  const publicKey = createPublicKey(key)
  const cert = forge.pki.createCertificate()
  cert.publicKey = forge.pki.publicKeyFromPem(publicKey.export({ type: 'spki', format: 'pem' }) as string)
  cert.serialNumber = randomSerialHex()
  cert.validity.notBefore = new Date(now - DAY)
  cert.validity.notAfter = new Date(now + CA_VALIDITY_DAYS * DAY)
  const name = [
    { shortName: 'CN', value: `Paygate Interception CA ${randomBase62(8)}`, valueTagClass: UTF8 },
    { shortName: 'O', value: 'Paygate', valueTagClass: UTF8 },
  ]
  cert.setSubject(name)
  cert.setIssuer(name)
  const keyId = keyIdAsn1(publicKey)
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, pathLenConstraint: 0, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier', value: keyId },
  ])
  return toPem(signCertificate(cert, null, key))
}

/**
 * DER of `cert` signed sha256WithRSA by `key` through node:crypto. `issuer`, when given,
 * replaces the TBS issuer with the CA's subject exactly as the CA encodes it.
 */
function signCertificate(cert: forge.pki.Certificate, issuer: forge.asn1.Asn1 | null, key: KeyObject): Buffer {
  cert.siginfo.algorithmOid = SHA256_WITH_RSA
  cert.signatureOid = SHA256_WITH_RSA
  const tbs = getTBSCertificate(cert)
  if (issuer) (tbs.value as forge.asn1.Asn1[])[3] = issuer
  const tbsDer = Buffer.from(forge.asn1.toDer(tbs).getBytes(), 'binary')
  const signature = sign('sha256', tbsDer, key)
  return tlv(0x30, Buffer.concat([tbsDer, SHA256_WITH_RSA_ALG_DER, tlv(0x03, Buffer.concat([Buffer.from([0]), signature]))]))
}

/** The CA's subject Name node, from the TBSCertificate forge kept when parsing it. */
function subjectOf(cert: forge.pki.Certificate): forge.asn1.Asn1 {
  const parts = cert.tbsCertificate.value as forge.asn1.Asn1[]
  const versioned = parts[0]?.tagClass === forge.asn1.Class.CONTEXT_SPECIFIC
  const subject = parts[versioned ? 5 : 4]
  if (!subject) throw new PaygateError('invalid_config', 'the CA certificate has no subject')
  return subject
}

/** subjectKeyIdentifier: SHA-1 of the RSAPublicKey (RFC 5280 4.2.1.2 method 1), as an OCTET STRING. */
function keyIdAsn1(publicKey: KeyObject): forge.asn1.Asn1 {
  const id = createHash('sha1')
    .update(publicKey.export({ type: 'pkcs1', format: 'der' }))
    .digest()
  return forge.asn1.create(forge.asn1.Class.UNIVERSAL, forge.asn1.Type.OCTETSTRING, false, id.toString('binary'))
}

/** A positive 128-bit serial with a non-zero top byte (minimal DER INTEGER). */
function randomSerialHex(): string {
  const b = randomBytes(16)
  b[0] = (b[0]! & 0x7f) | 0x40
  return b.toString('hex')
}

function tlv(tag: number, content: Buffer): Buffer {
  const n = content.length
  let len: Buffer
  if (n < 0x80) len = Buffer.from([n])
  else {
    const bytes: number[] = []
    for (let v = n; v > 0; v >>>= 8) bytes.unshift(v & 0xff)
    len = Buffer.from([0x80 | bytes.length, ...bytes])
  }
  return Buffer.concat([Buffer.from([tag]), len, content])
}

function toPem(der: Buffer): string {
  const b64 = der.toString('base64').replace(/.{64}/g, '$&\n').replace(/\n$/, '')
  return `-----BEGIN CERTIFICATE-----\n${b64}\n-----END CERTIFICATE-----\n`
}
