import type { Chain } from '../../chain/chain.js'
import type { Outbox } from '../../ledger/outbox.js'
import type { Store } from '../../store/index.js'
import type { Route } from '../router.js'

/** How long the health summary waits for the chain's block number before showing it as down. */
const CHAIN_ANSWER_MS = 1500
/** A ledger record sent this long ago without a receipt (five resends) makes the summary `degraded`. */
export const LEDGER_STALL_S = 300

async function blockNumberWithin(chain: Chain, ms: number): Promise<number | null> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), ms)
  })
  const answer = chain.blockNumber().then(
    (n) => Number(n),
    () => null,
  )
  return Promise.race([answer, late]).finally(() => clearTimeout(timer))
}

/**
 * `GET /v1/me`: who the key is (the dashboard's sign-in asks it). `GET /v1/health`: one
 * summary of the store, the chain and the ledger outbox for the dashboard's overview
 * (account key; `/readyz` stays the probe).
 */
export function summaryRoutes(deps: { store: Store; chain: Chain; outbox: Outbox }): Route[] {
  return [
    {
      method: 'GET',
      path: '/v1/me',
      access: 'agent',
      async handler(ctx) {
        const id = ctx.identity!
        return { status: 200, body: { kind: id.kind, keyId: id.keyId, ...(id.kind === 'agent' ? { agentId: id.agentId } : {}) } }
      },
    },
    {
      method: 'GET',
      path: '/v1/health',
      access: 'account',
      async handler() {
        const { store, chain, outbox } = deps
        const storeOk = store.status === 'open' && store.applyError === undefined
        const blockNumber = await blockNumberWithin(chain, CHAIN_ANSWER_MS)
        const pending = outbox.pending()
        const wait = outbox.oldestWaitMs()
        const oldestWaitS = wait === null ? null : Math.floor(wait / 1000)
        const outboxOk = oldestWaitS === null || oldestWaitS < LEDGER_STALL_S
        return {
          status: 200,
          body: {
            status: storeOk && blockNumber !== null && outboxOk ? 'ok' : 'degraded',
            store: { ok: storeOk, status: store.status },
            chain: { ok: blockNumber !== null, network: chain.info.network, chainId: chain.info.chainId, embedded: chain.embedded, blockNumber },
            outbox: { ok: outboxOk, pending, oldestWaitS },
          },
        }
      },
    },
  ]
}
