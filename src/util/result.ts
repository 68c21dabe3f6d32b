/** A call's result as a value, so its failure can be handled later (after an await, outside a lock). */
export type Result<T> = { ok: true; value: T } | { ok: false; error: unknown }

/** A promise's result as a value: awaited later without an unhandled rejection in between. */
export const outcome = <T>(p: Promise<T>): Promise<Result<T>> =>
  p.then(
    (value) => ({ ok: true as const, value }),
    (error: unknown) => ({ ok: false as const, error }),
  )

/** A synchronous call's result as a value. */
export function attempt<T>(fn: () => T): Result<T> {
  try {
    return { ok: true, value: fn() }
  } catch (error) {
    return { ok: false, error }
  }
}
