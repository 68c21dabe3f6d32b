import { PaygateError, invalid } from '../errors/index.js'

/**
 * Window arithmetic for the metrics API, pure: which buckets a window reads, at what
 * precision, and the step of its spend series. A window is widened at its start to the
 * bucket boundary: `1h` at 12:34:56 reads the minute buckets from 11:34 through 12:34.
 */
export const MINUTE_MS = 60_000
export const HOUR_MS = 3_600_000
export const DAY_MS = 86_400_000

/** Minute buckets are kept 48 hours, hour buckets 400 days. */
export const MINUTE_RETENTION_MS = 48 * HOUR_MS
export const HOUR_RETENTION_MS = 400 * DAY_MS

export const WINDOWS: Readonly<Record<string, number>> = { '1h': HOUR_MS, '24h': DAY_MS, '7d': 7 * DAY_MS, '30d': 30 * DAY_MS }
export const WINDOW_NAMES = Object.keys(WINDOWS)
export const DEFAULT_WINDOW = '24h'

export type Precision = 'minute' | 'hour'

export interface Span {
  /** First bucket start read (ms, aligned to `precision`). */
  from: number
  /** Last bucket start read (ms, aligned to `precision`), inclusive. */
  last: number
  precision: Precision
  /** Bucket size of `spend_series` (ms): a minute, an hour or a day. */
  step: number
}

export const sizeOf = (p: Precision): number => (p === 'minute' ? MINUTE_MS : HOUR_MS)
export const floorTo = (t: number, size: number): number => Math.floor(t / size) * size

/**
 * Windows up to 24 h are exact to the minute while their minute buckets are kept (48 h);
 * longer ones, or ones reaching further back, to the hour.
 */
export function precisionOf(from: number, to: number, now: number): Precision {
  return to - from <= DAY_MS && floorTo(from, MINUTE_MS) >= now - MINUTE_RETENTION_MS ? 'minute' : 'hour'
}

/** The series step for a window's length: minutes up to 2 h, hours up to 3 days, days beyond. */
export function stepOf(length: number): number {
  if (length <= 2 * HOUR_MS) return MINUTE_MS
  if (length <= 3 * DAY_MS) return HOUR_MS
  return DAY_MS
}

/** The span of payments made in [from, to] (ms), widened to whole buckets at both ends. */
export function spanOf(from: number, to: number, now: number): Span {
  const precision = precisionOf(from, to, now)
  const size = sizeOf(precision)
  return { from: floorTo(from, size), last: floorTo(to, size), precision, step: stepOf(to - from) }
}

/** The time a span counts up to: the end of its last bucket, or now while that bucket is open. */
export const spanEnd = (span: Span, now: number): number => Math.min(span.last + sizeOf(span.precision), now)

export interface WindowQuery {
  window?: string | null
  from?: string | null
  to?: string | null
}

function timestamp(field: 'from' | 'to', v: string): number {
  // ISO 8601 date-times only (a bare number or a locale date is refused).
  const t = /^\d{4}-\d{2}-\d{2}(T[\d:.]+(Z|[+-]\d{2}:?\d{2})?)?$/.test(v) ? Date.parse(v) : Number.NaN
  if (!Number.isFinite(t)) throw invalid(field, `${field} must be an ISO 8601 timestamp, e.g. 2026-01-01T00:00:00Z`)
  return t
}

/** Read `window`, or `from`/`to` (`to` exclusive, now when not given), into a span; 400 naming the field otherwise. */
export function resolveWindow(q: WindowQuery, now: number): Span {
  const hasRange = (q.from ?? null) !== null || (q.to ?? null) !== null
  if (q.window != null && hasRange) throw invalid('window', 'give either window or from/to, not both')
  if (!hasRange) {
    const name = q.window ?? DEFAULT_WINDOW
    const length = WINDOWS[name]
    if (length === undefined || !Object.hasOwn(WINDOWS, name)) {
      throw unknownValue('window', name, WINDOW_NAMES)
    }
    return spanOf(now - length, now, now)
  }
  if (q.from == null) throw invalid('from', 'from is required with to')
  const from = timestamp('from', q.from)
  const to = q.to == null ? null : timestamp('to', q.to)
  if (from >= (to ?? now)) throw invalid('from', 'from must be before to')
  // A `to` given is exclusive, as in the transactions' listing: a day ends before the next one's first bucket.
  return spanOf(from, to === null ? now : to - 1, now)
}

/** 400 naming the field and listing the allowed values. */
export function unknownValue(field: string, value: string, allowed: readonly string[]): PaygateError {
  return new PaygateError('invalid_request', `unknown ${field} ${JSON.stringify(value)}; allowed: ${allowed.join(', ')}`, { extra: { field, allowed } })
}

/** The bucket starts a span reads, oldest first. */
export function bucketStarts(span: Span): number[] {
  const size = sizeOf(span.precision)
  const out: number[] = []
  for (let t = span.from; t <= span.last; t += size) out.push(t)
  return out
}

/** The series points of a span: every step start from the first bucket's through the last's. */
export function seriesStarts(span: Span): number[] {
  const out: number[] = []
  for (let t = floorTo(span.from, span.step); t <= span.last; t += span.step) out.push(t)
  return out
}

/** Whether a bucket starting at `start` is still kept at `now`. */
export function kept(precision: Precision, start: number, now: number): boolean {
  return start >= now - (precision === 'minute' ? MINUTE_RETENTION_MS : HOUR_RETENTION_MS)
}
