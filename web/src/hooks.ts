import { useCallback, useEffect, useRef, useState } from 'preact/hooks'
import { api, type ApiError } from './api'

export interface Loaded<T> {
  data: T | undefined
  error: ApiError | Error | undefined
  loading: boolean
  reload(): void
}

/**
 * GET `path` (null: nothing to load) and, with `pollMs`, again every `pollMs` while the tab
 * is visible: the dashboard's live updates are polling with the key in the header.
 */
export function useApi<T = any>(path: string | null, pollMs?: number): Loaded<T> {
  // What is held belongs to one path: another path's answer is never shown for this one (a
  // failed load of a new page would show the last page's data under its error).
  const [state, setState] = useState<{ path: string | null; data?: T; error?: ApiError | Error; loading: boolean }>({ path, loading: !!path })
  const [tick, setTick] = useState(0)
  const reload = useCallback(() => setTick((n) => n + 1), [])
  useEffect(() => {
    if (!path) return
    let live = true
    const load = async (): Promise<void> => {
      try {
        const data = await api<T>('GET', path)
        if (live) setState({ path, data, loading: false })
      } catch (e) {
        // A failed poll keeps this path's last answer beside its error.
        if (live) setState((s) => ({ ...(s.path === path ? s : {}), path, error: e as Error, loading: false }))
      }
    }
    setState((s) => (s.path === path ? { ...s, loading: true, error: undefined } : { path, loading: true }))
    void load()
    if (!pollMs) return () => void (live = false)
    const timer = setInterval(() => {
      if (document.visibilityState === 'visible') void load()
    }, pollMs)
    return () => {
      live = false
      clearInterval(timer)
    }
  }, [path, pollMs, tick])
  const mine = state.path === path
  return { data: mine ? state.data : undefined, error: mine ? state.error : undefined, loading: mine ? state.loading : !!path, reload }
}

/** The hash route: `#/transactions` → ['transactions']; `#/tx/tx_1` → ['tx', 'tx_1']. */
export function useHashRoute(): string[] {
  const read = (): string[] =>
    location.hash
      .replace(/^#\/?/, '')
      .split('?')[0]!
      .split('/')
      .filter(Boolean)
      .map((s) => decodeURIComponent(s))
  const [route, setRoute] = useState(read)
  useEffect(() => {
    const on = (): void => setRoute(read())
    window.addEventListener('hashchange', on)
    return () => window.removeEventListener('hashchange', on)
  }, [])
  return route
}

/** Set once the user has navigated inside the dashboard: the first page load keeps the browser's focus. */
let navigated = false
window.addEventListener('hashchange', () => void (navigated = true))

/** Move focus to the page's main heading after navigation, for keyboard and screen-reader users. */
export function useFocusHeading(key: string): { current: HTMLHeadingElement | null } {
  const ref = useRef<HTMLHeadingElement | null>(null)
  useEffect(() => {
    if (navigated) ref.current?.focus()
  }, [key])
  return ref
}

export const href = (...parts: string[]): string => `#/${parts.map(encodeURIComponent).join('/')}`

/** USDC decimal (number or string) to integer base units: sums in the tree never touch floats. */
export function toUnits(v: number | string | undefined): bigint {
  if (v === undefined) return 0n
  const s = typeof v === 'number' ? v.toFixed(6) : v
  const m = /^(-?)(\d+)(?:\.(\d{0,6}))?/.exec(s)
  if (!m) return 0n
  const units = BigInt(m[2]!) * 1_000_000n + BigInt((m[3] ?? '').padEnd(6, '0'))
  return m[1] ? -units : units
}

export function fromUnits(u: bigint): string {
  const neg = u < 0n
  const a = neg ? -u : u
  const frac = (a % 1_000_000n).toString().padStart(6, '0').replace(/0+$/, '')
  return `${neg ? '-' : ''}${a / 1_000_000n}${frac ? `.${frac}` : ''}`
}

export const when = (iso: string | undefined): string => (iso ? new Date(iso).toLocaleString(undefined, { dateStyle: 'short', timeStyle: 'medium' }) : '—')
