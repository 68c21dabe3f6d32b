// The API client: the key lives in this tab's sessionStorage only and goes in the
// Authorization header, never in a URL.

const KEY_SLOT = 'paygate.apiKey'

export const session = {
  get key(): string | null {
    return sessionStorage.getItem(KEY_SLOT)
  },
  set(key: string): void {
    sessionStorage.setItem(KEY_SLOT, key)
  },
  clear(): void {
    sessionStorage.removeItem(KEY_SLOT)
  },
}

/** An API error answer: the spec's body `{error, detail, field?}` and its status. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    readonly detail: string,
    readonly field?: string,
  ) {
    super(detail || code)
  }

  /** The route itself is missing (a feature this gateway does not have yet), not a missing resource. */
  get routeMissing(): boolean {
    return this.status === 404 && this.detail.startsWith('no such endpoint')
  }
}

export async function api<T = any>(method: string, path: string, body?: unknown, key = session.key): Promise<T> {
  const headers: Record<string, string> = { accept: 'application/json' }
  if (key) headers.authorization = `Bearer ${key}`
  if (body !== undefined) headers['content-type'] = 'application/json'
  const res = await fetch(path, { method, headers, ...(body !== undefined ? { body: JSON.stringify(body) } : {}), cache: 'no-store', credentials: 'omit' })
  const text = await res.text()
  let parsed: any
  try {
    parsed = text ? JSON.parse(text) : undefined
  } catch {
    parsed = undefined
  }
  if (!res.ok) throw new ApiError(res.status, parsed?.error ?? 'error', parsed?.detail ?? text.slice(0, 200), parsed?.field)
  return parsed as T
}

/** A raw text answer (the CA certificate). */
export async function apiText(path: string): Promise<string> {
  const res = await fetch(path, { cache: 'no-store', credentials: 'omit' })
  if (!res.ok) throw new ApiError(res.status, 'error', `${res.status} ${res.statusText}`)
  return res.text()
}

export type Me = { kind: 'account'; keyId: string } | { kind: 'agent'; keyId: string; agentId: string }

export const qs = (params: Record<string, string | number | undefined | null>): string => {
  const p = new URLSearchParams()
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') p.set(k, String(v))
  const s = p.toString()
  return s ? `?${s}` : ''
}

export const usdc = (v: { usdc: number | string } | undefined | null): string => (v ? `${v.usdc} USDC` : '—')
