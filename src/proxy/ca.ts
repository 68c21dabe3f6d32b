import { X509Certificate } from 'node:crypto'
import { createSecureContext, rootCertificates, type SecureContext } from 'node:tls'
import { PaygateError } from '../errors/index.js'
import type { Logger } from '../log/index.js'
import { type Clock, systemClock } from '../util/clock.js'
import { Lru } from '../util/lru.js'
import type { Collection, Store } from '../store/index.js'
import { type CaFiles, type CaMaterial, loadCaMaterial } from './ca-files.js'
import { CA_COLLECTION, CA_ENTRY, loadStoredCaMaterial, type Sealer, type StoredCa } from './ca-stored.js'
import { type LeafIssuer, leafIssuer, mintLeaf, parseHost } from './ca-leaf.js'
import { DAY } from './ca-x509.js'

/**
 * Paygate's interception CA (node-forge lives only in src/proxy/ca*).
 *
 * Its files are created on first start and reused afterwards (ca-files.ts), or on PostgreSQL
 * it lives in the store, shared by the replicas (ca-stored.ts); leaves are
 * minted per host (ca-leaf.ts, encoding in ca-x509.ts) with one shared leaf key and
 * cached per host (LRU) here, with the TLS context that serves them.
 */

/** A cached leaf this close to its notAfter is minted again. */
const RENEW_BEFORE_MS = DAY
/** Warn at start when the CA has less than this left. */
const CA_EXPIRY_WARNING_MS = 30 * DAY
const DEFAULT_CACHE_SIZE = 1000

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
  readonly files: CaFiles
  /** What this load created: false means the file was already there and reused. */
  readonly created: { ca: boolean; leafKey: boolean }

  private readonly issuer: LeafIssuer
  private readonly clock: Clock
  private readonly capacity: number
  private readonly cache: Lru<string, Entry>
  private hits = 0
  private misses = 0

  private constructor(m: CaMaterial, clock: Clock, capacity: number) {
    this.certPem = m.certPem
    this.leafKeyPem = m.leafKeyPem
    this.files = m.files
    this.created = m.created
    this.clock = clock
    this.capacity = capacity
    this.cache = new Lru(capacity)
    this.fingerprint256 = m.caX509.fingerprint256
    this.subject = m.caX509.subject.replace(/\n/g, ', ')
    this.validTo = new Date(m.caX509.validTo)
    this.issuer = leafIssuer({ caKey: m.caKey, caX509: m.caX509, caForge: m.caForge, leafKey: m.leafKey, caCertFile: m.files.caCert })
  }

  /**
   * Load the CA from `certsDir`, creating `ca.key` (0600), `ca.pem` and `leaf.key` (0600)
   * when absent. A partial or broken set stops the start with an `invalid_config` error
   * naming the files.
   */
  static async load(certsDir: string, opts: CaOptions = {}): Promise<CertificateAuthority> {
    const clock = opts.clock ?? systemClock
    return CertificateAuthority.from(() => loadCaMaterial(certsDir, () => clock.now(), opts.log), { certsDir }, opts)
  }

  /**
   * Load the CA from the store (`ca/authority`, keys encrypted under the master key), creating
   * it when absent: how replicas on PostgreSQL share one CA. Call it holding the store's
   * initialisation lock.
   */
  static async loadStored(coll: Collection<StoredCa>, sealer: Sealer, opts: CaOptions = {}): Promise<CertificateAuthority> {
    const clock = opts.clock ?? systemClock
    return CertificateAuthority.from(() => loadStoredCaMaterial(coll, sealer, () => clock.now()), { store: `${CA_COLLECTION}/${CA_ENTRY}` }, opts)
  }

  /**
   * The CA of a gateway on `store`: the files of `certsDir` on LevelDB; on PostgreSQL the
   * store's, one for every replica, created once under the store's initialisation lock.
   */
  static forStore(store: Store, certsDir: string, sealer: Sealer, opts: CaOptions = {}): Promise<CertificateAuthority> {
    if (store.backend !== 'postgres') return CertificateAuthority.load(certsDir, opts)
    return store.withInitLock(() => CertificateAuthority.loadStored(store.collection<StoredCa>(CA_COLLECTION), sealer, opts))
  }

  private static async from(read: () => Promise<CaMaterial>, where: Record<string, string>, opts: CaOptions): Promise<CertificateAuthority> {
    const clock = opts.clock ?? systemClock
    const capacity = opts.cacheSize ?? DEFAULT_CACHE_SIZE
    if (!Number.isInteger(capacity) || capacity < 1) throw new PaygateError('invalid_config', `the leaf certificate cache size must be a positive integer (got ${capacity})`)
    const material = await read()
    const ca = new CertificateAuthority(material, clock, capacity)
    ca.selfTest(material.caX509)

    const { files, created } = ca
    if (ca.issuer.caNotAfter - clock.now() < CA_EXPIRY_WARNING_MS) {
      opts.log?.warn({ caCert: files.caCert, validTo: ca.validTo.toISOString() }, 'the interception CA expires soon: delete ca.key and ca.pem to create a new one, then redistribute it')
    }
    opts.log?.info(
      { ...where, created: created.ca, subject: ca.subject, fingerprint256: ca.fingerprint256, validTo: ca.validTo.toISOString() },
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
      return hit
    }
    this.misses++
    const entry: Entry = { ...mintLeaf(this.issuer, target, now), context: null }
    this.cache.set(target.name, entry)
    return entry
  }

  /** Mint one leaf at start and check it chains, so a CA we cannot sign for fails now rather than per CONNECT. */
  private selfTest(caX509: X509Certificate): void {
    const leaf = new X509Certificate(mintLeaf(this.issuer, { name: 'paygate.invalid', ip: null }, this.clock.now()).cert)
    if (!leaf.checkIssued(caX509) || !leaf.verify(caX509.publicKey) || leaf.checkHost('paygate.invalid') === undefined) {
      throw new PaygateError('invalid_config', `leaf certificates signed with ${this.files.caKey} do not verify against ${this.files.caCert}`)
    }
  }
}
