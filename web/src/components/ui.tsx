import type { ComponentChildren } from 'preact'
import { ApiError } from '../api'

/** An error answer shown where the data would be; a route the gateway lacks reads "not available". */
export function Failure({ error, what }: { error: Error | undefined; what: string }) {
  if (!error) return null
  if (error instanceof ApiError && error.routeMissing) {
    return (
      <p class="notice unavailable" data-testid="unavailable">
        {what}: not available on this gateway (its API has no such endpoint yet).
      </p>
    )
  }
  if (error instanceof ApiError && error.status === 403) {
    return (
      <p class="notice">
        {what}: not available to this key ({error.detail}).
      </p>
    )
  }
  return (
    <p class="notice error" role="alert">
      {what}: {error instanceof ApiError ? `${error.code}: ${error.detail}` : error.message}
    </p>
  )
}

export function Loading({ on }: { on: boolean }) {
  return on ? <p class="muted">Loading…</p> : null
}

/** A table that scrolls sideways on narrow screens; the scroll region is focusable for keyboards. */
export function Table({ caption, head, children, testid }: { caption: string; head: string[]; children: ComponentChildren; testid?: string }) {
  return (
    // biome-ignore lint/a11y/noNoninteractiveTabindex: a scrollable region must be reachable by keyboard
    <section class="table-wrap" tabIndex={0} aria-label={caption}>
      <table data-testid={testid}>
        <caption>{caption}</caption>
        <thead>
          <tr>
            {head.map((h) => (
              <th scope="col" key={h}>
                {h}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>{children}</tbody>
      </table>
    </section>
  )
}

export function Status({ value }: { value: string }) {
  return <span class={`status status-${value}`}>{value}</span>
}

/** A used-vs-cap bar: a labelled meter (exact numbers in text beside it). */
export function Bar({ label, used, cap }: { label: string; used: number; cap: number | undefined }) {
  const exact = cap ? Math.min(100, (used / cap) * 100) : 0
  const pct = Math.round(exact)
  // A little spend shows: a sliver of bar and "<1%", not an empty bar and "0%".
  const pctText = used > 0 && exact < 0.5 ? '<1%' : `${pct}%`
  const level = pct >= 100 ? 'over' : pct >= 80 ? 'warn' : 'ok'
  return (
    <div class="bar-row">
      <span class="bar-label">{label}</span>
      {/* biome-ignore lint/a11y/useSemanticElements: a styled bar (colour by level) with the meter role; <meter> cannot be styled alike across browsers */}
      <div class={`bar bar-${level}`} role="meter" aria-label={`${label} daily budget used`} aria-valuemin={0} aria-valuemax={100} aria-valuenow={pct}>
        <div class="bar-fill" style={{ width: `${exact}%` }} />
      </div>
      <span class="bar-text">{cap === undefined ? 'no daily cap' : `${used} / ${cap} USDC (${pctText})`}</span>
    </div>
  )
}

export function Field({ id, label, error, hint, children }: { id: string; label: string; error?: string | undefined; hint?: string; children: ComponentChildren }) {
  return (
    <div class={`field${error ? ' invalid' : ''}`}>
      <label for={id}>{label}</label>
      {children}
      {hint ? (
        <small id={`${id}-hint`} class="muted">
          {hint}
        </small>
      ) : null}
      {error ? (
        <small id={`${id}-error`} class="field-error" role="alert">
          {error}
        </small>
      ) : null}
    </div>
  )
}

/** The props that tie an input to its hint and error message. */
export const described = (id: string, error?: string, hint?: boolean) => ({
  id,
  'aria-invalid': error ? ('true' as const) : undefined,
  'aria-describedby': [hint ? `${id}-hint` : '', error ? `${id}-error` : ''].filter(Boolean).join(' ') || undefined,
})
