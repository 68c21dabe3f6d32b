import { createHash, createPublicKey, type KeyObject, randomBytes, sign } from 'node:crypto'
import forge from 'node-forge'
import { PaygateError } from '../errors/index.js'
import { randomBase62 } from '../util/random.js'

/**
 * Certificate encoding for the interception CA (node-forge lives only in src/proxy/ca*):
 * forge lays out the TBSCertificate, node:crypto signs it, and the DER is put together
 * here, so a new certificate costs well under a millisecond.
 */

export const HOUR = 3_600_000
export const DAY = 24 * HOUR
const CA_VALIDITY_DAYS = 3650

const SHA256_WITH_RSA = '1.2.840.113549.1.1.11'
/** AlgorithmIdentifier { sha256WithRSAEncryption, NULL } in DER. */
const SHA256_WITH_RSA_ALG_DER = Buffer.from('300d06092a864886f70d01010b0500', 'hex')
export const UTF8 = forge.asn1.Type.UTF8 as unknown as forge.asn1.Class // the typings call valueTagClass a Class; it is a Type

/** forge implements this but its typings omit it. */
const getTBSCertificate = (forge.pki as unknown as { getTBSCertificate(c: forge.pki.Certificate): forge.asn1.Asn1 }).getTBSCertificate

/** A node:crypto public key as forge's RSA public key. */
export const forgePublicKey = (publicKey: KeyObject): forge.pki.rsa.PublicKey => forge.pki.publicKeyFromPem(publicKey.export({ type: 'spki', format: 'pem' }) as string)

/** A new self-signed CA certificate (PEM) for `key`, valid ten years from a day before `now`. */
export function selfSignedCa(key: KeyObject, now: number): string {
  const publicKey = createPublicKey(key)
  const cert = forge.pki.createCertificate()
  cert.publicKey = forgePublicKey(publicKey)
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
export function signCertificate(cert: forge.pki.Certificate, issuer: forge.asn1.Asn1 | null, key: KeyObject): Buffer {
  cert.siginfo.algorithmOid = SHA256_WITH_RSA
  cert.signatureOid = SHA256_WITH_RSA
  const tbs = getTBSCertificate(cert)
  if (issuer) (tbs.value as forge.asn1.Asn1[])[3] = issuer
  const tbsDer = Buffer.from(forge.asn1.toDer(tbs).getBytes(), 'binary')
  const signature = sign('sha256', tbsDer, key)
  return tlv(0x30, Buffer.concat([tbsDer, SHA256_WITH_RSA_ALG_DER, tlv(0x03, Buffer.concat([Buffer.from([0]), signature]))]))
}

/** The CA's subject Name node, from the TBSCertificate forge kept when parsing it. */
export function subjectOf(cert: forge.pki.Certificate): forge.asn1.Asn1 {
  const parts = cert.tbsCertificate.value as forge.asn1.Asn1[]
  const versioned = parts[0]?.tagClass === forge.asn1.Class.CONTEXT_SPECIFIC
  const subject = parts[versioned ? 5 : 4]
  if (!subject) throw new PaygateError('invalid_config', 'the CA certificate has no subject')
  return subject
}

/** subjectKeyIdentifier: SHA-1 of the RSAPublicKey (RFC 5280 4.2.1.2 method 1), as an OCTET STRING. */
export function keyIdAsn1(publicKey: KeyObject): forge.asn1.Asn1 {
  const id = createHash('sha1')
    .update(publicKey.export({ type: 'pkcs1', format: 'der' }))
    .digest()
  return forge.asn1.create(forge.asn1.Class.UNIVERSAL, forge.asn1.Type.OCTETSTRING, false, id.toString('binary'))
}

/** A positive 128-bit serial with a non-zero top byte (minimal DER INTEGER). */
export function randomSerialHex(): string {
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

export function toPem(der: Buffer): string {
  const b64 = der.toString('base64').replace(/.{64}/g, '$&\n').replace(/\n$/, '')
  return `-----BEGIN CERTIFICATE-----\n${b64}\n-----END CERTIFICATE-----\n`
}
