import { writeFileSync } from 'node:fs'
import { connect as netConnect, type AddressInfo } from 'node:net'
import { join } from 'node:path'
import { createServer as createTlsServer } from 'node:tls'
import type { Test } from 'tap'
import { CertificateAuthority } from '../../src/proxy/ca.js'
import { startTestGateway, tempDir, type TestGateway } from './gateway.js'

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

/**
 * What the interception tests start from: a temp dir, the targets' own CA (its PEM file is
 * trusted by the gateway through PAYGATE_UPSTREAM_CA_FILE), a gateway on chain 84532 (the
 * x402 v1 packages' base-sepolia), Paygate's CA written to a file for clients, and `httpsOf`
 * to put a plain merchant behind a TLS front. `closers` run in reverse at teardown.
 */
export async function interceptionTestbed(t: Test): Promise<{
  dir: string
  upstreamCa: CertificateAuthority
  upstreamCaFile: string
  gw: TestGateway
  caFile: string
  proxyPort: string
  closers: (() => Promise<unknown>)[]
  httpsOf(target: { url: string }): Promise<string>
}> {
  const dir = tempDir()
  const upstreamCa = await CertificateAuthority.load(join(dir, 'upstream-ca'))
  const upstreamCaFile = join(dir, 'upstream-ca.pem')
  writeFileSync(upstreamCaFile, upstreamCa.certPem)
  const gw = await startTestGateway({ env: { PAYGATE_CHAIN_CHAIN_ID: '84532', PAYGATE_UPSTREAM_CA_FILE: upstreamCaFile } })
  t.teardown(() => gw.close())
  const caFile = join(dir, 'paygate-ca.pem')
  writeFileSync(caFile, (await gw.api('GET', '/v1/ca.pem', { key: null })).text)
  const closers: (() => Promise<unknown>)[] = []
  t.teardown(async () => {
    for (const c of closers.reverse()) await c()
  })
  return {
    dir,
    upstreamCa,
    upstreamCaFile,
    gw,
    caFile,
    proxyPort: new URL(gw.gw.proxyUrl).port,
    closers,
    async httpsOf(target) {
      const front = await tlsFront(upstreamCa, target.url)
      closers.push(front.close)
      return front.url
    },
  }
}
