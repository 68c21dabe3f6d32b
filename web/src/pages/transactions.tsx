import { useEffect, useRef, useState } from 'preact/hooks'
import { type Me, qs, usdc } from '../api'
import { Failure, Loading, Status, Table } from '../components/ui'
import { href, useApi, useFocusHeading, when } from '../hooks'

/** How often the first page is fetched again: new payments appear without a reload. */
export const LIVE_POLL_MS = 2000

export interface TxFilters {
  agentId: string
  status: string
  protocol: string
  from: string
  to: string
}

const EMPTY: TxFilters = { agentId: '', status: '', protocol: '', from: '', to: '' }
const STATUSES = ['', 'paid', 'pending', 'rejected', 'failed', 'unknown']

/** `datetime-local` is the browser's local time; the API takes ISO 8601. */
const iso = (local: string): string | undefined => (local ? new Date(local).toISOString() : undefined)

function FilterForm({ me, value, onApply }: { me: Me; value: TxFilters; onApply(f: TxFilters): void }) {
  const [f, setF] = useState(value)
  const set = (k: keyof TxFilters) => (e: Event) => setF({ ...f, [k]: (e.currentTarget as HTMLInputElement).value })
  return (
    <form
      class="filters"
      aria-label="Transaction filters"
      onSubmit={(e) => {
        e.preventDefault()
        onApply(f)
      }}
    >
      {me.kind === 'account' ? (
        <div class="field">
          <label for="f-agent">Agent</label>
          <input id="f-agent" value={f.agentId} onInput={set('agentId')} placeholder="any" />
        </div>
      ) : null}
      <div class="field">
        <label for="f-status">Status</label>
        <select id="f-status" value={f.status} onChange={set('status')}>
          {STATUSES.map((s) => (
            <option key={s} value={s}>
              {s || 'any'}
            </option>
          ))}
        </select>
      </div>
      <div class="field">
        <label for="f-protocol">Protocol</label>
        <select id="f-protocol" value={f.protocol} onChange={set('protocol')}>
          <option value="">any</option>
          <option value="x402">x402</option>
          <option value="mpp">mpp</option>
        </select>
      </div>
      <div class="field">
        <label for="f-from">From</label>
        <input id="f-from" type="datetime-local" value={f.from} onInput={set('from')} />
      </div>
      <div class="field">
        <label for="f-to">To</label>
        <input id="f-to" type="datetime-local" value={f.to} onInput={set('to')} />
      </div>
      <div class="actions">
        <button type="submit">Apply</button>
        <button
          type="button"
          class="secondary"
          onClick={() => {
            setF(EMPTY)
            onApply(EMPTY)
          }}
        >
          Clear
        </button>
      </div>
    </form>
  )
}

export function TxTable({ rows, fresh, caption }: { rows: any[]; fresh?: Set<string>; caption: string }) {
  return (
    <Table caption={caption} head={['Time', 'Agent', 'Status', 'Protocol', 'Paid', 'Endpoint']} testid="tx-table">
      {rows.map((t) => (
        <tr key={t.id} class={fresh?.has(t.id) ? 'fresh' : undefined} data-tx={t.id}>
          <td class="nowrap">
            <a href={href('tx', t.id)}>{when(t.timestamp)}</a>
          </td>
          <td>{t.agentId}</td>
          <td>
            <Status value={t.status} />
          </td>
          <td>{t.kind === 'invocation' ? 'invocation' : (t.protocol ?? '—')}</td>
          <td class="num">
            {usdc(t.amountPaid)}
            {t.status === 'rejected' && t.amountQuoted?.usdc ? <span class="muted"> (asked {usdc(t.amountQuoted)})</span> : null}
          </td>
          <td class="endpoint">{t.kind === 'invocation' ? <span class="muted">its sub-agent's payments are in its cost tree</span> : t.endpoint}</td>
        </tr>
      ))}
    </Table>
  )
}

/** The list with its paging cursor stack; the first page updates live. */
export function TransactionsPage({ me }: { me: Me }) {
  const h1 = useFocusHeading('transactions')
  const [filters, setFilters] = useState<TxFilters>(EMPTY)
  const [cursors, setCursors] = useState<string[]>([])
  const cursor = cursors[cursors.length - 1]
  const path = `/v1/transactions${qs({ limit: 25, agentId: filters.agentId.trim(), status: filters.status, protocol: filters.protocol, from: iso(filters.from), to: iso(filters.to), cursor })}`
  const page = useApi<{ transactions: any[]; nextCursor: string | null }>(path, cursor ? undefined : LIVE_POLL_MS)
  const seen = useRef<Set<string> | null>(null)
  const [fresh, setFresh] = useState<Set<string>>(new Set())
  const [announce, setAnnounce] = useState('')
  // Rows that were not on the previous poll of the same page are marked and announced.
  useEffect(() => {
    const rows = page.data?.transactions
    if (!rows) return
    const ids = new Set(rows.map((t) => t.id))
    if (seen.current) {
      const added = rows.filter((t) => !seen.current!.has(t.id)).map((t) => t.id)
      if (added.length) {
        setFresh(new Set(added))
        setAnnounce(`${added.length} new transaction${added.length > 1 ? 's' : ''}`)
      }
    }
    seen.current = ids
  }, [page.data])
  useEffect(() => {
    seen.current = null
  }, [path])
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Transactions
      </h1>
      <FilterForm
        me={me}
        value={filters}
        onApply={(f) => {
          setFilters(f)
          setCursors([])
        }}
      />
      <p class="live muted" aria-live="polite" data-testid="live">
        {cursor ? 'Live updates pause on later pages.' : `Live: refreshed every ${LIVE_POLL_MS / 1000} s.`} {announce}
      </p>
      <Failure error={page.error} what="Transactions" />
      <Loading on={page.loading && !page.data} />
      {page.data ? page.data.transactions.length ? <TxTable rows={page.data.transactions} fresh={fresh} caption="Transactions, newest first" /> : <p class="muted">No transactions match.</p> : null}
      <div class="pager">
        <button type="button" class="secondary" disabled={!cursors.length} onClick={() => setCursors(cursors.slice(0, -1))}>
          Newer
        </button>
        <button type="button" class="secondary" disabled={!page.data?.nextCursor} onClick={() => setCursors([...cursors, page.data!.nextCursor!])}>
          Older
        </button>
      </div>
    </>
  )
}
