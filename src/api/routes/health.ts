import type { Route } from '../router.js'

export interface ReadinessCheck {
  name: string
  check(): Promise<boolean>
}

/** `/healthz`: the process answers. `/readyz`: every dependency check passes (503 otherwise). */
export function healthRoutes(checks: ReadinessCheck[]): Route[] {
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
            results[c.name] = await c.check().catch(() => false)
          }),
        )
        const ready = Object.values(results).every(Boolean)
        return { status: ready ? 200 : 503, body: { status: ready ? 'ready' : 'not_ready', checks: results } }
      },
    },
  ]
}
