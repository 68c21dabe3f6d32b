import { connect as netConnect, type AddressInfo } from 'node:net'
import { createServer as createTlsServer } from 'node:tls'
import type { CertificateAuthority } from '../../src/proxy/ca.js'

/**
 * A TLS front for a plain HTTP server on 127.0.0.1 (`targetUrl`), with a certificate from
 * `ca` (the targets' own CA, which the gateway trusts through PAYGATE_UPSTREAM_CA_FILE).
 * Returns its https URL and a close function.
 */
export async function tlsFront(ca: CertificateAuthority, targetUrl: string): Promise<{ url: string; close(): Promise<void> }> {
  const target = Number(new URL(targetUrl).port)
  const leaf = ca.leafFor('127.0.0.1')
  const srv = createTlsServer({ cert: leaf.cert, key: leaf.key }, (s) => {
    const up = netConnect(target, '127.0.0.1')
    s.pipe(up).pipe(s)
    up.on('error', () => s.destroy())
    s.on('error', () => up.destroy())
  })
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  return { url: `https://127.0.0.1:${(srv.address() as AddressInfo).port}`, close: () => new Promise<void>((r) => srv.close(() => r())) }
}
