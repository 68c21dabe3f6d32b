/**
 * Every configuration key, once: its type, what is allowed, and its documentation.
 * Environment names and CLI flags are derived by one rule (see envName/flagName), so
 * `chain.rpcUrl` is `PAYGATE_CHAIN_RPC_URL` and `--chain-rpc-url`.
 */
import { parseRule } from '../net/egress-decide.js'

export type KeyKind = 'string' | 'path' | 'host' | 'port' | 'int' | 'enum' | 'url' | 'secret' | 'address' | 'amount' | 'bool' | 'hostList' | 'ruleList' | 'map'

export interface KeySpec {
  path: string
  kind: KeyKind
  /** May be null/unset. */
  optional?: boolean
  min?: number
  max?: number
  values?: readonly string[]
  /** Extra check for secrets and strings (and each value of a map or item of a rule list); returns what is allowed when the value fails. */
  check?: (v: string) => string | null
  doc: string
}

/** As the registry reads account keys (agents/keys.ts): a longer key would pass here and never authenticate. */
const API_KEY_RE = /^rp_live_[0-9A-Za-z]{32,128}$/

/** 32 bytes as 64 hex characters or base64 (44 characters with padding). */
export function decodeMasterKey(v: string): Buffer | null {
  if (/^(0x)?[0-9a-fA-F]{64}$/.test(v)) return Buffer.from(v.replace(/^0x/, ''), 'hex')
  if (/^[A-Za-z0-9+/]{43}=?$/.test(v)) {
    const b = Buffer.from(v, 'base64')
    if (b.length === 32) return b
  }
  return null
}

/** A PostgreSQL connection URL (credentials and options as the driver reads them). */
function postgresUrl(v: string): boolean {
  try {
    const u = new URL(v)
    return (u.protocol === 'postgres:' || u.protocol === 'postgresql:') && u.hostname !== ''
  } catch {
    return false
  }
}

/** Order of the secp256k1 group: a private key is an integer from 1 to n-1. */
const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n

/** A 0x-prefixed 32-byte hex secp256k1 private key. 0 and n or more pass a format check, then fail the start at key use, echoing the key in decimal. */
export function isPrivateKey(v: string): boolean {
  if (!/^0x[0-9a-fA-F]{64}$/.test(v)) return false
  const k = BigInt(v)
  return k >= 1n && k < SECP256K1_N
}

/** An `egress.allow` / `egress.deny` entry: null, or why not. */
function egressEntry(v: string): string | null {
  const r = parseRule(v)
  return typeof r === 'string' ? r : null
}

export const KEYS: readonly KeySpec[] = [
  { path: 'dataDir', kind: 'path', doc: 'Directory for LevelDB state, the account key file and the master key file.' },
  { path: 'certsDir', kind: 'path', doc: "Directory for Paygate's interception CA (generated content is git-ignored)." },
  {
    path: 'accountKey',
    kind: 'secret',
    optional: true,
    check: (v) => (API_KEY_RE.test(v) ? null : 'rp_live_ followed by 32 to 128 base62 characters'),
    doc: 'An extra account key (`rp_live_…`) accepted while it is set. Prefer the environment to a flag: flags show in `ps`.',
  },
  {
    path: 'masterKey',
    kind: 'secret',
    optional: true,
    check: (v) => (decodeMasterKey(v) ? null : '32 bytes as 64 hex characters or base64'),
    doc: 'Master key that encrypts wallet keys at rest (32 bytes, hex or base64). Unset: a key file is created with mode 0600 in the data directory.',
  },
  {
    path: 'store.postgresUrl',
    kind: 'secret',
    optional: true,
    check: (v) => (postgresUrl(v) ? null : 'a postgres:// or postgresql:// URL'),
    doc: 'PostgreSQL connection URL: all durable state goes there instead of LevelDB, shared by every replica that names it (docs/replicas.md). Unset: LevelDB under `dataDir`. A secret: it may carry a password.',
  },
  { path: 'api.host', kind: 'host', doc: 'Address the API port binds to (`0.0.0.0` inside containers).' },
  { path: 'api.port', kind: 'port', doc: 'API port (REST `/v1`, health). 0 picks a free port; the chosen one is printed.' },
  { path: 'api.maxBodyBytes', kind: 'int', min: 1024, max: 64 * 1024 * 1024, doc: 'Largest accepted API request body, in bytes; larger bodies get 413.' },
  {
    path: 'api.rateLimit.perMinute',
    kind: 'int',
    min: 1,
    max: 10_000_000,
    doc: 'Account-level API rate: requests per minute (token bucket refill). Over it: 429 `rate_limited` with `retryAfter`.',
  },
  { path: 'api.rateLimit.burst', kind: 'int', min: 1, max: 10_000_000, doc: 'Account-level API burst: requests allowed at once before the per-minute rate applies.' },
  {
    path: 'api.rateLimit.perKey.perMinute',
    kind: 'int',
    min: 1,
    max: 10_000_000,
    doc: "Each API key's own rate (every agent key and every account key has its own bucket), requests per minute, within the account-level rate. Over it: 429 `rate_limited` for that key only.",
  },
  { path: 'api.rateLimit.perKey.burst', kind: 'int', min: 1, max: 10_000_000, doc: "Each API key's own burst: requests allowed at once before its per-minute rate applies." },
  {
    path: 'api.rateLimit.accountReservePercent',
    kind: 'int',
    min: 0,
    max: 90,
    doc: 'Share of the account-level burst, in percent, that agent keys cannot take: kept for calls with an account key (an operator revoking a flooding agent key).',
  },
  {
    path: 'api.rateLimit.unauthenticated.perMinute',
    kind: 'int',
    min: 1,
    max: 10_000_000,
    doc: 'Per client address: requests per minute whose API key is missing, malformed, unknown or revoked (401). Past it they get 429 `rate_limited`; they never count against valid keys.',
  },
  { path: 'api.rateLimit.unauthenticated.burst', kind: 'int', min: 1, max: 10_000_000, doc: 'Per client address: burst of requests without a valid API key.' },
  {
    path: 'api.requestTimeoutMs',
    kind: 'int',
    min: 1000,
    max: 600_000,
    doc: 'Deadline for receiving a whole API request, head and body, in ms. Past it: 408 with the error body (`invalid_request`), and the connection closes.',
  },
  { path: 'api.dashboard', kind: 'bool', doc: 'Serve the web dashboard on the API port under `/ui/` (`/` redirects there). `false`: those paths answer 404.' },
  { path: 'proxy.host', kind: 'host', doc: 'Address the forward-proxy port binds to.' },
  { path: 'proxy.port', kind: 'port', doc: 'Forward-proxy port. 0 picks a free port.' },
  {
    path: 'proxy.maxBufferBytes',
    kind: 'int',
    min: 0,
    max: 256 * 1024 * 1024,
    doc: 'Request bodies up to this size are buffered so a paid retry can resend them; larger ones stream through and a 402 comes back unpaid with `X-Paygate-Error: request_body_too_large`.',
  },
  {
    path: 'proxy.defaultAgent',
    kind: 'string',
    optional: true,
    check: (v) => (/^[A-Za-z0-9._-]{1,64}$/.test(v) ? null : 'an agent id ([A-Za-z0-9._-]{1,64})'),
    doc: 'Sidecar mode: the agent used when a proxy request carries no credentials. Allowed only when the proxy binds to loopback, unless `proxy.allowRemoteDefaultAgent` is set.',
  },
  { path: 'proxy.allowRemoteDefaultAgent', kind: 'bool', doc: 'Allow `proxy.defaultAgent` on a non-loopback bind (a container whose port only the agent can reach).' },
  {
    path: 'proxy.accessLog',
    kind: 'bool',
    doc: "One info line per proxied request (agent, method, host, status, amount paid, error, ms). `false` turns that line off for requests that neither paid nor failed (as squid's `access_log none`); a paid or failed request keeps its line.",
  },
  {
    path: 'proxy.idleTimeoutMs',
    kind: 'int',
    min: 1000,
    max: 3_600_000,
    doc: 'How long a proxy connection, or a CONNECT tunnel, may sit idle (also before its first byte) before it is closed, in ms.',
  },
  {
    path: 'proxy.bufferTimeoutMs',
    kind: 'int',
    min: 1000,
    max: 600_000,
    doc: 'Deadline for receiving a request body the proxy buffers (up to `proxy.maxBufferBytes`), in ms. Past it: 408 with `X-Paygate-Error: invalid_request`, and the connection closes.',
  },
  { path: 'proxy.passThrough', kind: 'hostList', doc: 'Hosts tunnelled untouched through CONNECT (no interception, no paying), for pinned clients. Comma-separated in the environment.' },
  { path: 'chain.rpcUrl', kind: 'url', optional: true, doc: 'JSON-RPC URL of an external EVM chain. Unset: the embedded local chain.' },
  {
    path: 'chain.chainId',
    kind: 'int',
    min: 1,
    max: 2 ** 48,
    doc: 'Chain id. The embedded chain uses it (84532 lets x402 v1 packages settle on it as `base-sepolia`); an external chain must report it.',
  },
  {
    path: 'chain.network',
    kind: 'string',
    optional: true,
    check: (v) => (/^[a-z0-9][a-z0-9:_-]{0,63}$/.test(v) ? null : 'a network name such as base-mainnet (lower case, digits, - _ :)'),
    doc: 'Network name shown in wallets and `/v1/chain` (`<chain>-mainnet` style). Unset: `paygate-devnet` on the embedded chain, else derived from the chain id.',
  },
  { path: 'chain.token', kind: 'address', optional: true, doc: 'USDC (EIP-3009) token address on an external chain. Required with `chain.rpcUrl`; the embedded chain deploys its own.' },
  { path: 'chain.ledger', kind: 'address', optional: true, doc: 'PaymentLedger address on an external chain (deploy one with `paygate deploy-ledger`). Required with `chain.rpcUrl`.' },
  {
    path: 'chain.signerKey',
    kind: 'secret',
    optional: true,
    check: (v) => (isPrivateKey(v) ? null : 'a 0x-prefixed 32-byte hex secp256k1 private key (from 1 to the curve order n-1)'),
    doc: 'Service signer key that pays gas for ledger records on an external chain. Unset: one is generated and stored encrypted under the master key (its address is printed so you can fund it).',
  },
  { path: 'chain.rpcHost', kind: 'host', doc: 'Address the embedded chain serves JSON-RPC on (keep it on loopback).' },
  { path: 'chain.rpcPort', kind: 'port', doc: "Port of the embedded chain's JSON-RPC (not 8545, which a local anvil or Hardhat node takes). 0 picks a free port; `GET /v1/chain` shows the URL." },
  {
    path: 'chain.anvilPath',
    kind: 'path',
    optional: true,
    doc: 'The anvil binary for the embedded chain. Unset: the one shipped by the npm package for this platform (`@foundry-rs/anvil-linux-amd64`).',
  },
  { path: 'faucet.usdc', kind: 'amount', doc: 'Embedded chain only (dev faucet): USDC minted to each new wallet and per `POST /v1/wallets/<id>/faucet`.' },
  { path: 'faucet.gasEth', kind: 'amount', doc: 'Embedded chain only (dev faucet): native gas balance (ETH) given to each new wallet.' },
  { path: 'pay.timeoutMs', kind: 'int', min: 100, max: 600_000, doc: 'How long one attempt at the target may take (response headers and each body chunk) before it counts as a transient failure.' },
  {
    path: 'invoke.timeoutMs',
    kind: 'int',
    min: 100,
    max: 3_600_000,
    doc: "How long `POST /v1/agents/invoke` waits for the sub-agent's answer (headers, then each body chunk) before it answers 504 `sub_agent_failed`.",
  },
  { path: 'pay.idempotencyTtlHours', kind: 'int', min: 1, max: 24 * 30, doc: 'How long an idempotency key and its stored result are kept, per agent.' },
  {
    path: 'pay.maxAuthorizationSeconds',
    kind: 'int',
    min: 30,
    max: 86_400,
    doc: 'Longest validity Paygate signs into an on-chain authorization, whatever the offer asks (a longer `maxTimeoutSeconds` or `expires` is clamped to it). A payment whose outcome is unproven stays reserved until then.',
  },
  {
    path: 'mpp.methods',
    kind: 'map',
    check: (v) => (/^[a-z0-9_-]{1,32}$/.test(v) ? null : 'a rail name such as stablecoin, card or lightning'),
    doc: 'MPP method identifiers mapped to rails, over the built-in map (`stablecoin`, `usdc`, `tempo` → stablecoin; `card`, `stripe` → card; `lightning` → lightning). A JSON object in a config file; `tempo=stablecoin,acme=card` in the environment.',
  },
  {
    path: 'mpp.rates',
    kind: 'map',
    check: (v) => (/^\d{1,12}(\.\d{1,18})?$/.test(v) ? null : 'a decimal rate (USDC per unit), e.g. 1.08'),
    doc: 'USDC per unit of another MPP currency: `EUR=1.08` in the environment, `{"EUR": 1.08}` in a config file (a number or a string). Without a rate only USD and USDC (1:1, at most 6 decimals) are paid; converted amounts round up to the next base unit.',
  },
  {
    path: 'mpp.paymentEndpointHosts',
    kind: 'hostList',
    doc: "Hosts an MPP `paymentEndpoint` may be on besides the target's own origin (a shared payment service). Comma-separated in the environment.",
  },
  {
    path: 'mpp.sessionTtlSeconds',
    kind: 'int',
    min: 1,
    max: 30 * 24 * 3600,
    doc: 'Lifetime of an MPP session when neither the answer (`X-MPP-Session-Expires`) nor the offer (`sessionTtlSeconds`) names one.',
  },
  {
    path: 'mpp.cardProviderUrl',
    kind: 'url',
    optional: true,
    doc: "Card provider for the MPP card rail: Paygate POSTs each charge there and sends the returned token as the payment's authorization (see docs/payments.md). Unset: the card rail is off.",
  },
  { path: 'mpp.cardProviderKey', kind: 'secret', optional: true, doc: 'Bearer key sent to `mpp.cardProviderUrl`.' },
  {
    path: 'egress.allow',
    kind: 'ruleList',
    check: egressEntry,
    doc: 'CIDRs and host names agents may reach although denied by default (private ranges: 10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7), e.g. `10.20.0.0/16`, `billing.internal:8080`, `*.corp`. Never opens the always-denied targets (see docs/security.md). Comma-separated in the environment.',
  },
  {
    path: 'egress.deny',
    kind: 'ruleList',
    check: egressEntry,
    doc: 'CIDRs and host names nobody may reach through Paygate, over the defaults and `egress.allow` (e.g. `127.0.0.1:5432`, `[::1]:6379`, `203.0.113.0/24`). Comma-separated in the environment.',
  },
  {
    path: 'notify.timeoutMs',
    kind: 'int',
    min: 1000,
    max: 120_000,
    doc: 'How long one notification attempt (webhook, Slack, SMTP) may take before it counts as failed and is retried (1 min, 5 min, 30 min, 2 h, then dropped).',
  },
  { path: 'notify.concurrency', kind: 'int', min: 1, max: 256, doc: 'Notification attempts in flight at once; the rest wait in the queue on disk.' },
  { path: 'notify.retentionDays', kind: 'int', min: 1, max: 365, doc: 'Delivered and dropped deliveries are kept this many days in the delivery log (`GET /v1/deliveries`), then deleted.' },
  {
    path: 'notify.endpointPerMinute',
    kind: 'int',
    min: 1,
    max: 100_000,
    doc: 'At most this many deliveries per account webhook endpoint (`/v1/webhooks`) per minute; past it they are skipped and logged, so a storm of refusals does not become a storm of webhooks.',
  },
  {
    path: 'smtp.url',
    kind: 'secret',
    optional: true,
    check: (v) => (/^smtps?:\/\/[^/]+/.test(v) ? null : 'an smtp:// (STARTTLS when offered) or smtps:// (TLS) URL, e.g. smtp://user:pass@mail.example.com:587'),
    doc: 'SMTP server for e-mail alerts: `smtp://user:pass@host:587` (STARTTLS when the server offers it) or `smtps://…:465` (TLS). Unset: e-mail channels are refused. A secret: never logged.',
  },
  {
    path: 'smtp.from',
    kind: 'string',
    optional: true,
    check: (v) => (/^[^\r\n]{3,320}$/.test(v) && v.includes('@') ? null : 'a sender address, e.g. "Paygate <alerts@example.com>"'),
    doc: 'Sender of e-mail alerts, e.g. `Paygate <alerts@example.com>`. Needed with `smtp.url`: one set without the other stops the start when the configuration is loaded, naming both keys.',
  },
  { path: 'upstream.caFile', kind: 'path', optional: true, doc: 'PEM file of extra CAs trusted for upstream TLS (besides the system roots).' },
  { path: 'log.level', kind: 'enum', values: ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'], doc: 'Log level of the JSON logs on stdout.' },
  { path: 'shutdown.graceMs', kind: 'int', min: 0, max: 600_000, doc: 'On SIGINT/SIGTERM, how long in-flight requests may finish before connections are closed.' },
  { path: 'metrics.agentLabels', kind: 'bool', doc: 'Label Prometheus request and payment series by agent (one series per agent: keep it off with many agents).' },
  { path: 'metrics.requireKey', kind: 'bool', doc: 'Serve `GET /metrics` only with the account key (off: scrapers sit on an internal network).' },
]

const snake = (seg: string): string => seg.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toUpperCase()
const kebab = (seg: string): string => seg.replace(/([a-z0-9])([A-Z])/g, '$1-$2').toLowerCase()

export const envName = (path: string): string => `PAYGATE_${path.split('.').map(snake).join('_')}`
export const flagName = (path: string): string => `--${path.split('.').map(kebab).join('-')}`
