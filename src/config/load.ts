import { readFileSync } from 'node:fs'
import { isIP } from 'node:net'
import { resolve } from 'node:path'
import { PaygateError } from '../errors/index.js'
import { MIN_HIDDEN_LENGTH, shownUrl, urlSecrets } from '../util/redact.js'
import { KEYS, envName, flagName, type KeySpec } from './keys.js'

export interface Config {
  dataDir: string
  certsDir: string
  accountKey: string | null
  masterKey: string | null
  store: { postgresUrl: string | null }
  api: {
    host: string
    port: number
    maxBodyBytes: number
    requestTimeoutMs: number
    rateLimit: {
      perMinute: number
      burst: number
      perKey: { perMinute: number; burst: number }
      accountReservePercent: number
      unauthenticated: { perMinute: number; burst: number }
    }
    dashboard: boolean
  }
  proxy: {
    host: string
    port: number
    maxBufferBytes: number
    bufferTimeoutMs: number
    defaultAgent: string | null
    allowRemoteDefaultAgent: boolean
    passThrough: string[]
    accessLog: boolean
    idleTimeoutMs: number
  }
  chain: {
    rpcUrl: string | null
    chainId: number
    network: string | null
    token: `0x${string}` | null
    ledger: `0x${string}` | null
    signerKey: `0x${string}` | null
    rpcHost: string
    rpcPort: number
    anvilPath: string | null
  }
  /** Dev faucet amounts as decimal strings (USDC, ETH). */
  faucet: { usdc: string; gasEth: string }
  pay: { timeoutMs: number; idempotencyTtlHours: number; maxAuthorizationSeconds: number }
  invoke: { timeoutMs: number }
  mpp: {
    methods: Record<string, string>
    rates: Record<string, string>
    paymentEndpointHosts: string[]
    sessionTtlSeconds: number
    cardProviderUrl: string | null
    cardProviderKey: string | null
  }
  /** Entries as written (validated); net/egress-decide.ts parses them. */
  egress: { allow: string[]; deny: string[] }
  upstream: { caFile: string | null }
  notify: { timeoutMs: number; concurrency: number; retentionDays: number; endpointPerMinute: number }
  smtp: { url: string | null; from: string | null }
  log: { level: string }
  shutdown: { graceMs: number }
  metrics: { agentLabels: boolean; requireKey: boolean }
}

type Source = 'default' | 'file' | 'env' | 'flag'
type Raw = { value: unknown; source: Source }

const DEFAULT_FILE = new URL('../../config/default.json', import.meta.url)

const MAP_KEYS = new Set(KEYS.filter((k) => k.kind === 'map').map((k) => k.path))

/** Flatten a nested JSON object into dotted leaf paths (a map-valued key is a leaf). */
function flatten(obj: unknown, prefix = '', out = new Map<string, unknown>()): Map<string, unknown> {
  if (obj && typeof obj === 'object' && !Array.isArray(obj)) {
    for (const [k, v] of Object.entries(obj)) {
      const p = prefix ? `${prefix}.${k}` : k
      if (v && typeof v === 'object' && !Array.isArray(v) && !MAP_KEYS.has(p)) flatten(v, p, out)
      else out.set(p, v)
    }
  }
  return out
}

function readJson(file: string | URL, what: string): unknown {
  let text: string
  try {
    text = readFileSync(file, 'utf8')
  } catch (e) {
    throw new PaygateError('invalid_config', `${what} ${String(file)} cannot be read: ${(e as Error).message}`)
  }
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch (e) {
    throw new PaygateError('invalid_config', `${what} ${String(file)} is not valid JSON: ${(e as Error).message}`)
  }
  // Anything else holds no keys: read as one, it would start on the defaults without a word.
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    const kind = parsed === null ? 'null' : Array.isArray(parsed) ? 'an array' : `a ${typeof parsed}`
    throw new PaygateError('invalid_config', `${what} ${String(file)} must hold a JSON object of settings (e.g. {"api": {"port": 8403}}), not ${kind}`)
  }
  return parsed
}

const BY_PATH = new Map(KEYS.map((k) => [k.path, k]))
const BY_FLAG = new Map(KEYS.flatMap((k) => [[flagName(k.path), k] as const, [`--${k.path}`, k] as const]))

export interface LoadInput {
  argv?: readonly string[]
  env?: Readonly<Record<string, string | undefined>>
  cwd?: string
}

/**
 * Parse CLI flags (`--api-port 0`, `--api-port=0`, `--api.port=0`, `--config file`).
 * Returns the flags and the remaining positional arguments.
 */
export function parseFlags(argv: readonly string[]): { flags: Map<string, string>; config?: string; positional: string[] } {
  const flags = new Map<string, string>()
  const positional: string[] = []
  let config: string | undefined
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (!arg.startsWith('--')) {
      positional.push(arg)
      continue
    }
    const eq = arg.indexOf('=')
    const name = eq >= 0 ? arg.slice(0, eq) : arg
    const takeValue = (): string => {
      if (eq >= 0) return arg.slice(eq + 1)
      const next = argv[i + 1]
      if (next === undefined) throw new PaygateError('invalid_config', `flag ${name} needs a value`)
      i++
      return next
    }
    if (name === '--config') {
      config = takeValue()
      continue
    }
    const spec = BY_FLAG.get(name)
    if (!spec) {
      // Boolean switches of sub-commands (e.g. --bundle) are left to them.
      positional.push(arg)
      continue
    }
    flags.set(spec.path, takeValue())
  }
  return { flags, ...(config !== undefined ? { config } : {}), positional }
}

function describeValue(spec: KeySpec, v: unknown): string {
  if (spec.kind === 'secret') return `<redacted, ${String(v).length} characters>`
  if (spec.kind === 'url' && typeof v === 'string') return JSON.stringify(shownUrl(v))
  return JSON.stringify(v)
}

/** A normalised value and null, or undefined and what is allowed. */
type Checked = [unknown, string | null]

/** Validate one value; returns [normalised value, null] or [undefined, what is allowed]. */
function validate(spec: KeySpec, v: unknown, cwd: string): Checked {
  if (v === null || v === undefined || v === '') {
    return spec.optional ? [null, null] : [undefined, 'a value (this key is required)']
  }
  switch (spec.kind) {
    case 'port': {
      const n = asInt(v)
      return n !== null && n >= 0 && n <= 65535 ? [n, null] : [undefined, 'an integer port 0-65535 (0 picks a free port)']
    }
    case 'int':
      return validateInt(spec, v)
    case 'enum':
      return typeof v === 'string' && spec.values!.includes(v) ? [v, null] : [undefined, `one of ${spec.values!.join(', ')}`]
    case 'host': {
      const ok = typeof v === 'string' && (isIP(v) !== 0 || /^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/.test(v))
      return ok ? [v, null] : [undefined, 'a hostname or IP address, e.g. 127.0.0.1 or 0.0.0.0']
    }
    case 'url':
      return validateUrl(v)
    case 'address':
      return typeof v === 'string' && /^0x[0-9a-fA-F]{40}$/.test(v) ? [v, null] : [undefined, 'a 0x-prefixed 20-byte hex address']
    case 'amount': {
      const str = typeof v === 'number' ? String(v) : typeof v === 'string' ? v.trim() : ''
      return /^\d+(\.\d{1,18})?$/.test(str) ? [str, null] : [undefined, 'a non-negative decimal amount, e.g. 100 or 0.5']
    }
    case 'path':
      return typeof v === 'string' ? [resolve(cwd, v), null] : [undefined, 'a file system path']
    case 'bool':
      return validateBool(v)
    case 'hostList':
      return validateHostList(v)
    case 'ruleList':
      return validateRuleList(spec, v)
    case 'map':
      return validateMap(spec, v)
    case 'secret':
    case 'string': {
      if (typeof v !== 'string') return [undefined, 'a string']
      const why = spec.check?.(v) ?? null
      return why ? [undefined, why] : [v, null]
    }
  }
}

/** A safe integer from a JSON number or integer text, else null. */
function asInt(v: unknown): number | null {
  const n = typeof v === 'number' ? v : typeof v === 'string' && /^-?\d+$/.test(v.trim()) ? Number(v) : NaN
  return Number.isSafeInteger(n) ? n : null
}

function validateInt(spec: KeySpec, v: unknown): Checked {
  const n = asInt(v)
  const lo = spec.min ?? Number.MIN_SAFE_INTEGER
  const hi = spec.max ?? Number.MAX_SAFE_INTEGER
  return n !== null && n >= lo && n <= hi ? [n, null] : [undefined, `an integer from ${lo} to ${hi}`]
}

function validateUrl(v: unknown): Checked {
  if (typeof v === 'string') {
    try {
      const u = new URL(v)
      if (u.protocol === 'http:' || u.protocol === 'https:' || u.protocol === 'ws:' || u.protocol === 'wss:') return [v, null]
    } catch {
      /* fall through */
    }
  }
  return [undefined, 'an http(s) or ws(s) URL']
}

function validateBool(v: unknown): Checked {
  if (typeof v === 'boolean') return [v, null]
  if (v === 'true' || v === '1') return [true, null]
  if (v === 'false' || v === '0') return [false, null]
  return [undefined, 'true or false']
}

/** A list as a file gives it (an array) or as the environment does (comma-separated text); null otherwise. */
function listOf(v: unknown): unknown[] | null {
  if (Array.isArray(v)) return v
  if (typeof v !== 'string') return null
  return v
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean)
}

const allStrings = (items: unknown[] | null): items is string[] => items?.every((x) => typeof x === 'string') ?? false

function validateHostList(v: unknown): Checked {
  const items = listOf(v)
  return allStrings(items) && items.every((x) => /^[A-Za-z0-9.*:[\]-]{1,253}$/.test(x))
    ? [items.map((x) => x.toLowerCase()), null]
    : [undefined, 'a list of host names (comma-separated in the environment)']
}

function validateRuleList(spec: KeySpec, v: unknown): Checked {
  const items = listOf(v)
  if (!allStrings(items)) return [undefined, 'a list of CIDRs and host names (comma-separated in the environment)']
  const bad = items.map((x) => spec.check?.(x) ?? null).filter((x) => x !== null)
  return bad.length ? [undefined, bad.join('; ')] : [items.map((x) => x.trim().toLowerCase()), null]
}

function validateMap(spec: KeySpec, v: unknown): Checked {
  let entries: [string, unknown][] | null = null
  if (typeof v === 'object' && !Array.isArray(v)) entries = Object.entries(v as object)
  else if (typeof v === 'string') {
    const pairs = v
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean)
      .map((x) => x.split('='))
    if (pairs.every((p) => p.length === 2)) entries = pairs.map(([k, val]) => [k!.trim(), val!.trim()])
  }
  const what = `key=value pairs (comma-separated in the environment, an object in a file) with values: ${spec.check?.('\u0000') ?? 'strings'}`
  if (!entries) return [undefined, what]
  const out: Record<string, string> = {}
  for (const [k, given] of entries) {
    // A file's JSON may give a rate as a number ({"EUR": 1.08}): its shortest form is the text written.
    const val = typeof given === 'number' && Number.isFinite(given) && typeof v === 'object' ? String(given) : given
    if (!/^[A-Za-z0-9._:/-]{1,64}$/.test(k) || typeof val !== 'string' || spec.check?.(val)) return [undefined, what]
    out[k] = val
  }
  return [out, null]
}

function setPath(obj: Record<string, unknown>, path: string, value: unknown): void {
  const parts = path.split('.')
  let cur = obj
  for (const p of parts.slice(0, -1)) cur = (cur[p] ??= {}) as Record<string, unknown>
  cur[parts[parts.length - 1]!] = value
}

/**
 * What of the configuration must never reach a log or an error message, each with what is
 * shown instead: every secret's value (long enough to be told from ordinary text), and URLs
 * that may carry credentials (`shownUrl`).
 */
export function secretTexts(config: Config): [text: string, shown: string][] {
  const out: [string, string][] = []
  for (const spec of KEYS) {
    let v: unknown = config
    for (const p of spec.path.split('.')) v = (v as Record<string, unknown> | null)?.[p]
    if (typeof v !== 'string' || !v) continue
    if (spec.kind === 'secret' && v.length >= MIN_HIDDEN_LENGTH) out.push([v, '[redacted]'])
    else if (spec.kind === 'url') out.push(...urlSecrets(v))
  }
  return out
}

const SOURCE_TEXT: Record<Source, (spec: KeySpec, file?: string) => string> = {
  default: (s) => `from config/default.json; set ${envName(s.path)}`,
  file: (s, f) => `from ${f}; or set ${envName(s.path)}`,
  env: (s) => `from ${envName(s.path)}`,
  flag: (s) => `from ${flagName(s.path)}`,
}

/** Keys that only work together: one set without the other, each named with its value and where it came from. */
const PAIRS: readonly (readonly [string, string, string])[] = [['smtp.url', 'smtp.from', 'e-mail alerts need both: set both, or neither']]

function pairProblems(config: Config, raw: Map<string, Raw>, file: string | undefined): string[] {
  const out: string[] = []
  const at = (path: string): unknown => path.split('.').reduce<unknown>((o, p) => (o as Record<string, unknown> | undefined)?.[p], config)
  for (const [a, b, why] of PAIRS) {
    const [va, vb] = [at(a), at(b)]
    // A key refused above is already reported; undefined here means that.
    if (va === undefined || vb === undefined || (va === null) === (vb === null)) continue
    const [set, unset] = va === null ? [b, a] : [a, b]
    const shown = (path: string): string => {
      const spec = BY_PATH.get(path)!
      const r = raw.get(path) ?? { value: null, source: 'default' as const }
      return `${path} = ${describeValue(spec, r.value)} (${SOURCE_TEXT[r.source](spec, file)})`
    }
    out.push(`${shown(set)} is set but ${unset} is not (${SOURCE_TEXT[raw.get(unset)?.source ?? 'default'](BY_PATH.get(unset)!, file)}); ${why}`)
  }
  return out
}

/**
 * Build the configuration: config/default.json < file (PAYGATE_CONFIG or --config) <
 * environment (PAYGATE_*) < CLI flags. Validated once; every bad value is reported with
 * its key, value, where it came from and what is allowed.
 */
export function loadConfig(input: LoadInput = {}): { config: Config; positional: string[] } {
  const env = input.env ?? {}
  const cwd = input.cwd ?? process.cwd()
  const { flags, config: configFlag, positional } = parseFlags(input.argv ?? [])
  const raw = new Map<string, Raw>()
  const problems: string[] = []

  for (const [path, value] of flatten(readJson(DEFAULT_FILE, 'default config'))) raw.set(path, { value, source: 'default' })

  const file = configFlag ?? env.PAYGATE_CONFIG
  const fileAbs = file ? resolve(cwd, file) : undefined
  if (fileAbs) {
    for (const [path, value] of flatten(readJson(fileAbs, 'config file'))) {
      if (!BY_PATH.has(path)) problems.push(`${path} (from ${fileAbs}) is not a known configuration key`)
      else raw.set(path, { value, source: 'file' })
    }
  }
  for (const spec of KEYS) {
    const v = env[envName(spec.path)]
    // Empty means unset (e.g. `PAYGATE_API_PORT=` in a compose file): the file or default applies.
    if (v !== undefined && v !== '') raw.set(spec.path, { value: v, source: 'env' })
  }
  for (const [path, value] of flags) raw.set(path, { value, source: 'flag' })

  const out: Record<string, unknown> = {}
  for (const spec of KEYS) {
    const r = raw.get(spec.path) ?? { value: null, source: 'default' as const }
    const [value, allowed] = validate(spec, r.value, cwd)
    if (allowed) {
      problems.push(`${spec.path} = ${describeValue(spec, r.value)} (${SOURCE_TEXT[r.source](spec, fileAbs)}) is not allowed; expected ${allowed}`)
    } else setPath(out, spec.path, value)
  }
  problems.push(...pairProblems(out as unknown as Config, raw, fileAbs))
  if (problems.length) throw new PaygateError('invalid_config', `invalid configuration:\n  ${problems.join('\n  ')}`)
  return { config: out as unknown as Config, positional }
}
