import type { CertificateAuthority } from '../../proxy/ca.js'
import type { Route } from '../router.js'

/** `GET /v1/ca.pem`: Paygate's interception CA, for clients to trust (public, like any CA certificate). */
export function caRoutes(ca: CertificateAuthority): Route[] {
  return [
    {
      method: 'GET',
      path: '/v1/ca.pem',
      access: 'public',
      handler: async () => ({ status: 200, raw: { contentType: 'application/x-pem-file', data: ca.certPem } }),
    },
  ]
}
