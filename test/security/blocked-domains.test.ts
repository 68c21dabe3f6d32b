import t from 'tap'
import { decide } from '../../src/policy/decide.js'
import { domainOf, normalizeHost } from '../../src/policy/domains.js'

/** A policy's domain lists see one spelling of a host: the policy-side half of the egress finding. */

t.test('blockedDomains: an IPv4-mapped IPv6 host is its IPv4 address', async (t) => {
  for (const s of ['[::ffff:127.0.0.1]', '::ffff:127.0.0.1', '::ffff:7f00:1', '[0:0:0:0:0:ffff:7f00:1]']) t.equal(normalizeHost(s), '127.0.0.1', s)
  t.equal(domainOf('http://[::ffff:127.0.0.1]:8080/x'), '127.0.0.1')
  t.equal(domainOf('http://[::ffff:7f00:1]/x'), '127.0.0.1')
  t.equal(normalizeHost('::1'), '::1', 'other IPv6 stays IPv6')
  const policy = { blockedDomains: ['127.0.0.1'] } as never
  const usage = { days: {}, payments: [] } as never
  for (const url of ['http://127.0.0.1:9/p', 'http://[::ffff:127.0.0.1]:9/p', 'http://[::ffff:7f00:1]:9/p']) {
    t.match(decide(policy, usage, { host: domainOf(url), amount: 1n }, 0), { ok: false, reason: 'domain_blocked' }, url)
  }
  // An entry stored as a mapped address before this normalisation still blocks.
  t.match(decide({ blockedDomains: ['::ffff:7f00:1'] } as never, usage, { host: domainOf('http://127.0.0.1/'), amount: 1n }, 0), { ok: false, reason: 'domain_blocked' })
})
