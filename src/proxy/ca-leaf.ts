import { createPublicKey, type KeyObject, type X509Certificate } from 'node:crypto'
import { isIPv4, isIPv6 } from 'node:net'
import forge from 'node-forge'
import { PaygateError } from '../errors/index.js'
import { DAY, forgePublicKey, HOUR, keyIdAsn1, randomSerialHex, signCertificate, subjectOf, toPem, UTF8 } from './ca-x509.js'

/** Minting a leaf certificate for one intercepted host, signed by the CA. */

/** Leaves live a year (well under the 398-day browser limit) and never past the CA. */
const LEAF_VALIDITY_DAYS = 365
/** X.520 ub-common-name: longer names go only into the SAN. */
const MAX_CN_LENGTH = 64

/** A CONNECT/SNI host reduced to what goes into a certificate. */
export interface Target {
  /** Cache key and CN: lower-case name, or the canonical IP text. */
  name: string
  /** The 4 or 16 address bytes for an IP SAN; null for a DNS name. */
  ip: Buffer | null
}

/** What every leaf takes from the CA and the shared leaf key, worked out once at load. */
export interface LeafIssuer {
  caKey: KeyObject
  caNotAfter: number
  /** The CA's subject Name as forge parsed it from the CA's own DER (the leaves' issuer, byte for byte). */
  caSubjectAsn1: forge.asn1.Asn1
  caKeyId: string | null
  /** Named in the error when the CA has expired. */
  caCertFile: string
  leafPublic: forge.pki.rsa.PublicKey
  leafKeyIdAsn1: forge.asn1.Asn1
}

export function leafIssuer(init: { caKey: KeyObject; caX509: X509Certificate; caForge: forge.pki.Certificate; leafKey: KeyObject; caCertFile: string }): LeafIssuer {
  const ski = init.caForge.getExtension('subjectKeyIdentifier') as { subjectKeyIdentifier?: string } | null
  const leafPublic = createPublicKey(init.leafKey)
  return {
    caKey: init.caKey,
    caNotAfter: new Date(init.caX509.validTo).getTime(),
    caSubjectAsn1: subjectOf(init.caForge),
    caKeyId: ski?.subjectKeyIdentifier ? forge.util.hexToBytes(ski.subjectKeyIdentifier) : null,
    caCertFile: init.caCertFile,
    leafPublic: forgePublicKey(leafPublic),
    leafKeyIdAsn1: keyIdAsn1(leafPublic),
  }
}

/** A leaf certificate (PEM) for `target` and its notAfter; throws `unavailable` once the CA has expired. */
export function mintLeaf(issuer: LeafIssuer, target: Target, now: number): { cert: string; notAfter: number } {
  const notAfter = Math.min(now + LEAF_VALIDITY_DAYS * DAY, issuer.caNotAfter)
  if (notAfter <= now) throw new PaygateError('unavailable', `the interception CA ${issuer.caCertFile} has expired; delete ca.key and ca.pem to create a new one`)
  const cert = forge.pki.createCertificate()
  cert.publicKey = issuer.leafPublic
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
    { name: 'subjectKeyIdentifier', value: issuer.leafKeyIdAsn1 },
  ]
  if (issuer.caKeyId) exts.push({ name: 'authorityKeyIdentifier', keyIdentifier: issuer.caKeyId })
  cert.setExtensions(exts)
  return { cert: toPem(signCertificate(cert, issuer.caSubjectAsn1, issuer.caKey)), notAfter }
}

const LABEL_RE = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/

/** Normalise a CONNECT/SNI host (`Example.COM.`, `[::1]`, `127.0.0.1`) or refuse it. */
export function parseHost(raw: string): Target {
  let h = raw.trim().toLowerCase()
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1)
  if (isIPv4(h)) return { name: h, ip: Buffer.from(h.split('.').map(Number)) }
  if (isIPv6(h) && !h.includes('%')) {
    const canonical = new URL(`http://[${h}]/`).hostname.slice(1, -1)
    return { name: canonical, ip: ipv6Bytes(canonical) }
  }
  if (h.endsWith('.')) h = h.slice(0, -1)
  if (h.length > 0 && h.length <= 253 && h.split('.').every((l) => LABEL_RE.test(l))) return { name: h, ip: null }
  throw new PaygateError('invalid_request', `cannot issue a certificate for host ${JSON.stringify(raw.slice(0, 300))}`, { extra: { field: 'host' } })
}

/** The 16 bytes of a canonical (WHATWG URL) IPv6 text: hex groups, at most one `::`. */
function ipv6Bytes(canonical: string): Buffer {
  const [head = '', tail] = canonical.split('::')
  const groups = (s: string | undefined): string[] => (s ? s.split(':') : [])
  const left = groups(head)
  const right = groups(tail)
  const all = tail === undefined ? left : [...left, ...Array<string>(8 - left.length - right.length).fill('0'), ...right]
  const out = Buffer.alloc(16)
  for (const [i, g] of all.entries()) out.writeUInt16BE(parseInt(g, 16), i * 2)
  return out
}
