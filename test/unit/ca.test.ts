import t, { type Test } from 'tap'
import { X509Certificate, createPrivateKey, createPublicKey } from 'node:crypto'
import { cpSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { createServer as createNetServer, isIP, type AddressInfo, type Server as NetServer } from 'node:net'
import { join } from 'node:path'
import { TLSSocket, checkServerIdentity, connect, createServer, rootCertificates, type PeerCertificate, type SecureContext, type Server } from 'node:tls'
import { CertificateAuthority } from '../../src/proxy/ca.js'
import { PaygateError } from '../../src/errors/index.js'
import { ManualClock } from '../../src/util/clock.js'
import { tempDir as makeTempDir, testDir } from '../helpers/gateway.js'

const DAY = 86_400_000

const tempDir = (): string => makeTempDir('paygate-ca-')
const modeOf = (file: string): number => statSync(file).mode & 0o777

/** Load a fresh CA into a temp dir (removed at teardown). */
async function freshCa(t: Test, opts: Parameters<typeof CertificateAuthority.load>[1] = {}): Promise<{ dir: string; ca: CertificateAuthority }> {
  const dir = testDir(t, 'paygate-ca-')
  return { dir, ca: await CertificateAuthority.load(dir, opts) }
}

async function rejectsConfig(t: Test, p: Promise<unknown>, detail: RegExp, msg: string): Promise<void> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  )
  t.ok(err instanceof PaygateError, `${msg}: a PaygateError`)
  t.equal((err as PaygateError).code, 'invalid_config', `${msg}: invalid_config`)
  t.match((err as PaygateError).detail, detail, `${msg}: ${(err as PaygateError).detail}`)
}

t.test('first load creates the CA and leaf key; later loads reuse them', async (t) => {
  const dir = testDir(t, 'paygate-ca-')

  // Key generation runs off the event loop: a timer keeps firing while the keys are made.
  let ticks = 0
  let last = performance.now()
  let maxGap = 0
  const timer = setInterval(() => {
    const now = performance.now()
    maxGap = Math.max(maxGap, now - last)
    last = now
    ticks++
  }, 2)
  const started = performance.now()
  const ca = await CertificateAuthority.load(dir)
  clearInterval(timer)
  t.comment(`first load (two RSA-2048 keys + CA): ${(performance.now() - started).toFixed(1)} ms, ${ticks} timer ticks, longest event-loop gap ${maxGap.toFixed(1)} ms`)
  t.ok(ticks > 0, 'the event loop kept running during key generation')

  t.same(ca.created, { ca: true, leafKey: true })
  t.equal(modeOf(join(dir, 'ca.key')), 0o600, 'ca.key is 0600')
  t.equal(modeOf(join(dir, 'leaf.key')), 0o600, 'leaf.key is 0600')
  t.equal(readFileSync(join(dir, 'ca.pem'), 'utf8'), ca.certPem, 'ca.pem holds the CA certificate')
  t.equal(readFileSync(join(dir, 'leaf.key'), 'utf8'), ca.leafKeyPem)
  t.match(readFileSync(join(dir, 'ca.key'), 'utf8'), /^-----BEGIN PRIVATE KEY-----\n/)

  const x = new X509Certificate(ca.certPem)
  t.ok(x.ca, 'CA:TRUE')
  t.match(x.subject, /^CN=Paygate Interception CA [0-9A-Za-z]{8}\nO=Paygate$/)
  t.equal(x.issuer, x.subject, 'self-signed')
  t.ok(x.verify(x.publicKey), 'self-signature verifies')
  t.ok(x.checkPrivateKey(createPrivateKey(readFileSync(join(dir, 'ca.key'), 'utf8'))), 'ca.key is its key')
  t.equal(x.publicKey.asymmetricKeyDetails?.modulusLength, 2048)
  const years = (Date.parse(x.validTo) - Date.now()) / (365 * DAY)
  t.ok(years > 9.9 && years < 10.1, `valid ~10 years (${years.toFixed(2)})`)
  t.ok(Date.parse(x.validFrom) <= Date.now())
  t.equal(ca.fingerprint256, x.fingerprint256)

  const again = await CertificateAuthority.load(dir)
  t.same(again.created, { ca: false, leafKey: false })
  t.equal(again.certPem, ca.certPem, 'the same CA certificate')
  t.equal(again.leafKeyPem, ca.leafKeyPem, 'the same leaf key')
  t.equal(again.fingerprint256, ca.fingerprint256)
  t.ok(new X509Certificate(again.leafFor('reuse.test').cert).verify(x.publicKey), 'a reloaded CA signs leaves the first one would accept')

  const { ca: other } = await freshCa(t)
  t.not(other.subject, ca.subject, 'two installs have different CA names')
  t.not(other.fingerprint256, ca.fingerprint256)
  t.not(new X509Certificate(other.certPem).serialNumber, x.serialNumber)
})

t.test('leaves for a name, an IPv4 and an IPv6 literal', async (t) => {
  const { ca } = await freshCa(t)
  const caX = new X509Certificate(ca.certPem)
  const leafPublic = createPublicKey(createPrivateKey(ca.leafKeyPem)).export({ type: 'spki', format: 'der' })
  const now = Date.now()
  const cases = [
    { host: 'example.test', san: 'DNS:example.test', cn: 'CN=example.test' },
    { host: '127.0.0.1', san: 'IP Address:127.0.0.1', cn: 'CN=127.0.0.1' },
    { host: '::1', san: 'IP Address:0:0:0:0:0:0:0:1', cn: 'CN=::1' },
  ]
  for (const c of cases) {
    const leaf = ca.leafFor(c.host)
    t.equal(leaf.key, ca.leafKeyPem, `${c.host}: the shared leaf key`)
    const x = new X509Certificate(leaf.cert)
    t.equal(x.subject, c.cn, `${c.host}: CN`)
    t.equal(x.subjectAltName, c.san, `${c.host}: SAN`)
    t.equal(x.issuer, caX.subject, `${c.host}: issuer is the CA`)
    t.ok(x.checkIssued(caX), `${c.host}: checkIssued`)
    t.ok(x.verify(caX.publicKey), `${c.host}: signature verifies with the CA key`)
    t.notOk(x.ca, `${c.host}: not a CA`)
    t.same(x.keyUsage, ['1.3.6.1.5.5.7.3.1'], `${c.host}: extKeyUsage serverAuth`)
    t.ok(x.publicKey.export({ type: 'spki', format: 'der' }).equals(leafPublic), `${c.host}: the leaf key's public half`)
    if (isIP(c.host)) {
      t.equal(x.checkIP(c.host), c.host, `${c.host}: checkIP`)
      t.equal(x.checkHost(c.host, { subject: 'never' }), undefined, `${c.host}: no DNS name in the SAN`)
    } else {
      t.equal(x.checkHost(c.host), c.host, `${c.host}: checkHost`)
      t.equal(x.checkHost('other.test'), undefined, `${c.host}: not another host`)
    }
    const from = Date.parse(x.validFrom)
    const to = Date.parse(x.validTo)
    t.ok(from <= now - 59 * 60_000 && from >= now - 61 * 60_000, `${c.host}: valid from an hour ago (${x.validFrom})`)
    t.ok(to - now > 360 * DAY && to - now < 398 * DAY, `${c.host}: valid about a year, under 398 days (${x.validTo})`)
    t.ok(to <= Date.parse(caX.validTo), `${c.host}: not past the CA`)
  }
  t.not(new X509Certificate(ca.leafFor('a.test').cert).serialNumber, new X509Certificate(ca.leafFor('b.test').cert).serialNumber, 'random serials')

  // Forms of the same host share one entry; a long name goes only into the SAN.
  t.equal(ca.leafFor('[::1]').cert, ca.leafFor('::1').cert, '[::1] is ::1')
  t.equal(ca.leafFor('0:0:0:0:0:0:0:1').cert, ca.leafFor('::1').cert, 'IPv6 spelled out is ::1')
  t.equal(ca.leafFor('Example.TEST.').cert, ca.leafFor('example.test').cert, 'case and a trailing dot do not matter')
  const long = `${'a'.repeat(63)}.${'b'.repeat(40)}.test`
  const lx = new X509Certificate(ca.leafFor(long).cert)
  t.equal(lx.checkHost(long), long, 'a name longer than 64 characters still verifies')
  t.equal(lx.subject, undefined, 'with an empty subject (CN is limited to 64 characters)')

  for (const bad of ['', 'bad host', '*.example.test', 'a..b', `${'x'.repeat(64)}.test`, 'fe80::1%eth0']) {
    t.throws(() => ca.leafFor(bad), { code: 'invalid_request' }, `refuses ${JSON.stringify(bad)}`)
  }
})

/**
 * Serve one TLS handshake and return what the client saw. `createServer`: a tls.Server
 * picking the context by SNI. `TLSSocket`: what the proxy does after CONNECT, wrapping
 * the raw socket with the CONNECT target's context as the default (clients send no SNI
 * for an IP literal) and SNI on top.
 */
async function handshake(
  ca: CertificateAuthority,
  host: string,
  clientCa: string[] | undefined,
  via: 'createServer' | 'TLSSocket' = 'createServer',
): Promise<{ sni: string | null; peer: PeerCertificate }> {
  const ip = isIP(host) !== 0
  let sni: string | null = null
  const SNICallback = (name: string, cb: (err: Error | null, ctx?: SecureContext) => void): void => {
    sni = name
    ca.sniCallback(name, cb)
  }
  let server: Server | NetServer
  if (via === 'createServer') {
    // A tls.Server ignores a `secureContext` option; with no SNI (IP literal) it serves its key/cert.
    server = createServer({ SNICallback, ...(ip ? ca.leafFor(host) : {}) })
    server.on('secureConnection', (s) => s.end('ok'))
    server.on('tlsClientError', () => {})
  } else {
    server = createNetServer((raw) => {
      const s = new TLSSocket(raw, { isServer: true, secureContext: ca.secureContextFor(host), SNICallback })
      s.on('secure', () => s.end('ok'))
      s.on('error', () => raw.destroy())
    })
  }
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  try {
    return await new Promise((resolve, reject) => {
      const socket = connect({
        host: '127.0.0.1',
        port,
        ...(ip ? {} : { servername: host }),
        ...(clientCa ? { ca: clientCa } : {}),
        rejectUnauthorized: true,
        checkServerIdentity: (_name, cert) => checkServerIdentity(host, cert),
      })
      socket.once('secureConnect', () => {
        const peer = socket.getPeerCertificate()
        socket.end()
        resolve({ sni, peer })
      })
      socket.once('error', reject)
    })
  } finally {
    await new Promise((resolve) => server.close(resolve))
  }
}

t.test('real TLS handshakes trust the leaves through the CA alone', async (t) => {
  const { ca } = await freshCa(t)
  for (const via of ['createServer', 'TLSSocket'] as const) {
    for (const host of ['example.test', '127.0.0.1', '::1']) {
      const { sni, peer } = await handshake(ca, host, [ca.certPem], via)
      t.equal(sni, isIP(host) ? null : host, `${via} ${host}: SNI ${isIP(host) ? 'absent' : 'seen'}`)
      t.equal(peer.subject.CN, host, `${via} ${host}: handshake completed with rejectUnauthorized, CN ${peer.subject.CN}`)
    }
  }

  const noCa = await handshake(ca, 'example.test', undefined).then(
    () => null,
    (e: NodeJS.ErrnoException) => e,
  )
  t.equal(noCa?.code, 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'without the Paygate CA the client refuses the leaf')

  const { ca: stranger } = await freshCa(t)
  const wrongCa = await handshake(ca, 'example.test', [stranger.certPem]).then(
    () => null,
    (e: NodeJS.ErrnoException) => e,
  )
  t.ok(wrongCa, `another install's CA does not vouch for these leaves (${wrongCa?.code})`)
})

t.test('the leaf cache: hits, normalised keys, LRU eviction, renewal near expiry', async (t) => {
  const clock = new ManualClock(Date.now())
  const { ca } = await freshCa(t, { cacheSize: 2, clock })
  t.same(ca.stats(), { hits: 0, misses: 0, size: 0, capacity: 2 })

  const first = ca.secureContextFor('cache.test')
  t.same(ca.stats(), { hits: 0, misses: 1, size: 1, capacity: 2 }, 'first CONNECT mints')
  t.equal(ca.secureContextFor('cache.test'), first, 'second CONNECT reuses the same SecureContext')
  t.equal(ca.secureContextFor('CACHE.test.'), first, 'and so does another spelling of the host')
  t.same(ca.stats(), { hits: 2, misses: 1, size: 1, capacity: 2 })

  ca.secureContextFor('b.test') // miss
  ca.secureContextFor('cache.test') // hit: now most recent
  ca.secureContextFor('c.test') // miss, evicts b.test
  t.same(ca.stats(), { hits: 3, misses: 3, size: 2, capacity: 2 })
  t.equal(ca.secureContextFor('cache.test'), first, 'the recently used host stayed')
  ca.secureContextFor('b.test')
  t.equal(ca.stats().misses, 4, 'the least recently used host was evicted and minted again')

  const cert = ca.leafFor('b.test').cert
  clock.advance(360 * DAY)
  t.equal(ca.leafFor('b.test').cert, cert, 'a leaf with days left is still served')
  clock.advance(5 * DAY)
  const renewed = ca.leafFor('b.test').cert
  t.not(renewed, cert, 'a leaf within a day of expiry is minted again')
  t.ok(Date.parse(new X509Certificate(renewed).validTo) > clock.now() + 300 * DAY)

  await t.rejects(CertificateAuthority.load(tempDir(), { cacheSize: 0 }), { code: 'invalid_config' })
})

t.test('mint timing (printed, not asserted)', async (t) => {
  const { ca } = await freshCa(t, { cacheSize: 1000 })
  const n = 200
  let start = performance.now()
  for (let i = 0; i < n; i++) ca.leafFor(`leaf-${i}.timing.test`)
  const leafMs = (performance.now() - start) / n
  start = performance.now()
  for (let i = 0; i < n; i++) ca.secureContextFor(`ctx-${i}.timing.test`)
  const ctxMs = (performance.now() - start) / n
  start = performance.now()
  for (let i = 0; i < n; i++) ca.secureContextFor(`ctx-${i}.timing.test`)
  const hitMs = (performance.now() - start) / n
  t.comment(`new leaf certificate: ${leafMs.toFixed(3)} ms mean over ${n} hosts`)
  t.comment(`new leaf + tls.SecureContext: ${ctxMs.toFixed(3)} ms mean over ${n} hosts`)
  t.comment(`cached SecureContext: ${hitMs.toFixed(4)} ms mean`)
  t.equal(ca.stats().misses, 2 * n)
  t.equal(ca.stats().hits, n)
})

t.test('broken or partial files stop the load with a clear error', async (t) => {
  const { dir: good } = await freshCa(t)
  const { dir: other } = await freshCa(t)
  const copy = (): string => {
    const d = testDir(t, 'paygate-ca-')
    cpSync(good, d, { recursive: true })
    return d
  }

  let d = copy()
  writeFileSync(join(d, 'ca.key'), '-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n')
  await rejectsConfig(t, CertificateAuthority.load(d), new RegExp(`${join(d, 'ca.key')} is not a readable PEM private key`), 'corrupted ca.key')

  d = copy()
  writeFileSync(join(d, 'ca.key'), readFileSync(join(d, 'ca.key'), 'utf8').slice(0, 200))
  await rejectsConfig(t, CertificateAuthority.load(d), /ca\.key is not a readable PEM private key/, 'truncated ca.key')

  d = copy()
  cpSync(join(other, 'ca.key'), join(d, 'ca.key'))
  await rejectsConfig(t, CertificateAuthority.load(d), new RegExp(`${join(d, 'ca.key')} is not the key of ${join(d, 'ca.pem')}`), 'ca.key from another install')

  d = copy()
  writeFileSync(join(d, 'ca.pem'), 'garbage')
  await rejectsConfig(t, CertificateAuthority.load(d), /ca\.pem is not a readable RSA PEM certificate/, 'corrupted ca.pem')

  d = copy()
  rmSync(join(d, 'ca.pem'))
  await rejectsConfig(t, CertificateAuthority.load(d), new RegExp(`${join(d, 'ca.key')} exists but ${join(d, 'ca.pem')} is missing`), 'missing ca.pem')

  d = copy()
  rmSync(join(d, 'ca.key'))
  await rejectsConfig(t, CertificateAuthority.load(d), /ca\.pem exists but .*ca\.key is missing/, 'missing ca.key')

  d = copy()
  writeFileSync(join(d, 'leaf.key'), 'nope')
  await rejectsConfig(t, CertificateAuthority.load(d), /leaf\.key is not a readable PEM private key/, 'corrupted leaf.key')

  d = copy()
  rmSync(join(d, 'leaf.key'))
  const regrown = await CertificateAuthority.load(d)
  t.same(regrown.created, { ca: false, leafKey: true }, 'a missing leaf key alone is simply made again')
  t.equal(regrown.certPem, readFileSync(join(good, 'ca.pem'), 'utf8'))

  d = copy()
  await rejectsConfig(t, CertificateAuthority.load(d, { clock: new ManualClock(Date.now() + 11 * 365 * DAY) }), /expired on/, 'an expired CA')
})

t.test('bundle: the root certificates plus the Paygate CA', async (t) => {
  const { ca } = await freshCa(t)
  const bundle = ca.bundle()
  const blocks = bundle.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? []
  t.equal(blocks.length, rootCertificates.length + 1, `${rootCertificates.length} roots + the Paygate CA`)
  t.equal(`${blocks.at(-1)}\n`, ca.certPem, 'the Paygate CA is last')
  t.ok(
    blocks.slice(0, -1).every((b, i) => b === rootCertificates[i]?.trim()),
    'the roots in order',
  )
  t.ok(bundle.endsWith('\n'))

  // The bundle as a client's only trust store completes a handshake.
  const { peer } = await handshake(ca, 'bundle.test', [bundle])
  t.equal(peer.subject.CN, 'bundle.test')
})
