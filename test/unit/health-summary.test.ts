import t from 'tap'
import type { Chain } from '../../src/chain/chain.js'
import type { Outbox } from '../../src/ledger/outbox.js'
import type { Store } from '../../src/store/index.js'
import { LEDGER_STALL_S, summaryRoutes } from '../../src/api/routes/summary.js'

/** `GET /v1/health`'s verdict from its parts: the store, the chain, and how long the ledger outbox's oldest record has waited. */
const health = async (oldestWaitMs: number | null, blockNumber: bigint | null = 7n) => {
  const store = { status: 'open', applyError: undefined } as unknown as Store
  const chain = {
    blockNumber: async () => (blockNumber === null ? Promise.reject(new Error('down')) : blockNumber),
    info: { network: 'paygate-devnet', chainId: 31337 },
    embedded: true,
  } as unknown as Chain
  const outbox = { pending: () => 4, oldestWaitMs: () => oldestWaitMs } as unknown as Outbox
  const route = summaryRoutes({ store, chain, outbox }).find((r) => r.path === '/v1/health')!
  return (await route.handler({} as never)).body as { status: string; outbox: unknown; chain: { ok: boolean } }
}

t.test('a ledger record waiting past the stall limit makes the summary degraded', async (t) => {
  t.match(await health(null), { status: 'ok', outbox: { ok: true, pending: 4, oldestWaitS: null } })
  t.match(await health(12_345), { status: 'ok', outbox: { ok: true, oldestWaitS: 12 } })
  t.match(await health(LEDGER_STALL_S * 1000), { status: 'degraded', outbox: { ok: false, oldestWaitS: LEDGER_STALL_S } })
  t.match(await health(null, null), { status: 'degraded', chain: { ok: false }, outbox: { ok: true } })
})
