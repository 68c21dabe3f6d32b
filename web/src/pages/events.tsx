import { useState } from 'preact/hooks'
import { type Me, qs } from '../api'
import { Failure, Loading, Table } from '../components/ui'
import { href, useApi, useFocusHeading, when } from '../hooks'

const REASONS = ['', 'domain_blocked', 'domain_not_allowed', 'per_call_limit_exceeded', 'rate_limit_exceeded', 'daily_budget_exceeded', 'budget_exceeded']

/** Policy rejections (`status=rejected`), newest first, with reason, detail and endpoint. */
export function EventsPage({ me }: { me: Me }) {
  const h1 = useFocusHeading('events')
  const [agentId, setAgentId] = useState('')
  const [reason, setReason] = useState('')
  const [applied, setApplied] = useState({ agentId: '', reason: '' })
  const [cursors, setCursors] = useState<string[]>([])
  const cursor = cursors[cursors.length - 1]
  const page = useApi<{ transactions: any[]; nextCursor: string | null }>(
    `/v1/transactions${qs({ status: 'rejected', limit: 100, agentId: applied.agentId.trim(), cursor })}`,
    cursor ? undefined : 5000,
  )
  const rows = page.data?.transactions.filter((t) => !applied.reason || t.reason === applied.reason)
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Policy Events
      </h1>
      <form
        class="filters"
        aria-label="Policy event filters"
        onSubmit={(e) => {
          e.preventDefault()
          setApplied({ agentId, reason })
          setCursors([])
        }}
      >
        {me.kind === 'account' ? (
          <div class="field">
            <label for="e-agent">Agent</label>
            <input id="e-agent" value={agentId} onInput={(e) => setAgentId(e.currentTarget.value)} placeholder="any" />
          </div>
        ) : null}
        <div class="field">
          <label for="e-reason">Reason</label>
          <select id="e-reason" value={reason} onChange={(e) => setReason(e.currentTarget.value)}>
            {REASONS.map((r) => (
              <option key={r} value={r}>
                {r || 'any'}
              </option>
            ))}
          </select>
        </div>
        <div class="actions">
          <button type="submit">Filter</button>
        </div>
      </form>
      <Failure error={page.error} what="Policy events" />
      <Loading on={page.loading && !page.data} />
      {rows ? (
        rows.length ? (
          <Table caption="Policy rejections, newest first" head={['Time', 'Agent', 'Reason', 'Detail', 'Endpoint']} testid="events-table">
            {rows.map((t) => (
              <tr key={t.id}>
                <td class="nowrap">
                  <a href={href('tx', t.id)}>{when(t.timestamp)}</a>
                </td>
                <td class="nowrap">{t.agentId}</td>
                <td class="nowrap">
                  <code>{t.reason}</code>
                </td>
                <td>{t.detail}</td>
                <td class="endpoint">{t.endpoint}</td>
              </tr>
            ))}
          </Table>
        ) : (
          <p class="muted">No policy events match.</p>
        )
      ) : null}
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
