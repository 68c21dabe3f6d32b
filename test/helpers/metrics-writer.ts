import { RecordHooks } from '../../src/ledger/record-hooks.js'
import { newTxId, Transactions, type TxRecord } from '../../src/ledger/transactions.js'
import type { Aggregates } from '../../src/metrics/aggregates.js'
import type { Store } from '../../src/store/index.js'

/** Writes records through the record hook with `aggregates` as contributor, in the engine's order (metrics tests). */
export function writer(store: Store, aggregates: Aggregates) {
  const transactions = new Transactions(store)
  const hooks = new RecordHooks()
  hooks.add(aggregates.contributor)
  hooks.addPreparer(aggregates.prepare)
  const base = (agentId: string, at: number, amount: bigint, more: Partial<TxRecord>): TxRecord => ({
    id: newTxId(at),
    agentId,
    status: 'pending',
    createdAt: at,
    updatedAt: at,
    endpoint: 'https://api.example/v1/data',
    method: 'GET',
    protocol: 'x402',
    amount: amount.toString(),
    txHash: null,
    parentTxHash: null,
    depth: 0,
    ...more,
  })
  return {
    transactions,
    hooks,
    /** Reserved at `at`, paid at `paidAt` (the engine's order: prepare, then the paid write). */
    async pay(agentId: string, at: number, amount: bigint, more: Partial<TxRecord> = {}, paidAt = at + 200): Promise<void> {
      const pending = base(agentId, at, amount, more)
      await store.batch([...transactions.ops(pending), ...hooks.ops({ kind: 'reserved', record: pending })])
      await hooks.prepare(pending)
      const paid: TxRecord = { ...pending, status: 'paid', updatedAt: paidAt }
      await store.batch([...transactions.ops(paid, pending), ...hooks.ops({ kind: 'paid', record: paid, prev: pending })])
    },
    async reject(agentId: string, at: number, reason: string): Promise<void> {
      const r = { ...base(agentId, at, 5n, {}), status: 'rejected' as const, reason }
      await store.batch([...transactions.ops(r), ...hooks.ops({ kind: 'rejected', record: r })])
    },
    session: (agentId: string, at: number) => store.batch([...hooks.ops({ kind: 'session', agentId, at, endpoint: 'https://mpp.example/s' })]),
  }
}
