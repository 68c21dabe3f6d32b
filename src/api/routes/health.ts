import type { Route } from '../router.js'

export interface ReadinessCheck {
  name: string
  check(): Promise<boolean>
}

/**
 * How long `/readyz` waits for a check before counting it as failed: a probe must get an answer
 * promptly whatever a dependency does (a chain behind a proxy that never answers would
 * otherwise hold it for the RPC client's full timeout and retries, a frozen node forever).
 */
export const READY_CHECK_TIMEOUT_MS = 1500

/** `check`'s answer, false when it throws or has not answered within `ms`. */
function answerWithin(check: () => Promise<boolean>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(false), ms)
  })
  const answer = Promise.resolve()
    .then(check)
    .catch(() => false)
  return Promise.race([answer, late]).finally(() => clearTimeout(timer))
}

/** `/healthz`: the process answers. `/readyz`: every dependency check passes (503 otherwise). */
export function healthRoutes(checks: ReadinessCheck[], timeoutMs = READY_CHECK_TIMEOUT_MS): Route[] {
  return [
    { method: 'GET', path: '/healthz', access: 'public', handler: async () => ({ status: 200, body: { status: 'ok' } }) },
    {
      method: 'GET',
      path: '/readyz',
      access: 'public',
      async handler() {
        const results: Record<string, boolean> = {}
        await Promise.all(
          checks.map(async (c) => {
            results[c.name] = await answerWithin(() => c.check(), timeoutMs)
          }),
        )
        const ready = Object.values(results).every(Boolean)
        return { status: ready ? 200 : 503, body: { status: ready ? 'ready' : 'not_ready', checks: results } }
      },
    },
  ]
}
