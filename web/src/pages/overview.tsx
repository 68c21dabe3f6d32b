import { useEffect, useState } from 'preact/hooks'
import { api, type Me, qs } from '../api'
import { SpendChart } from '../components/chart'
import { Bar, Failure, Loading, Status, Table } from '../components/ui'
import { fromUnits, href, toUnits, useApi, useFocusHeading, when } from '../hooks'

const POLL_MS = 5000

interface Budget {
  agentId: string
  used: number
  cap: number | undefined
}

/** Each agent's daily budget used vs its cap (an agent key: its own). */
function useBudgets(me: Me): { budgets: Budget[] | undefined; error: Error | undefined } {
  const agents = useApi<{ agents: { agentId: string }[] }>(me.kind === 'account' ? '/v1/agents?limit=50' : null, POLL_MS)
  const ids = me.kind === 'agent' ? [me.agentId] : agents.data?.agents.map((a) => a.agentId)
  const [budgets, setBudgets] = useState<Budget[]>()
  const [error, setError] = useState<Error>()
  const key = ids?.join(',')
  useEffect(() => {
    if (!ids) return
    Promise.all(ids.map((id) => api('GET', `/v1/policies/${encodeURIComponent(id)}`)))
      .then((ps) => setBudgets(ps.map((p) => ({ agentId: p.agentId, used: p.dailyBudget?.usedToday ?? 0, cap: p.dailyBudget?.usdc }))))
      .catch(setError)
  }, [key, agents.data])
  return { budgets, error: agents.error ?? error }
}

/** Protocol split from the metrics API, else counted from the latest paid transactions. */
function ProtocolSplit({ metrics, me }: { metrics: any; me: Me }) {
  const recent = useApi<{ transactions: any[] }>(metrics ? null : `/v1/transactions${qs({ status: 'paid', limit: 200, agentId: me.kind === 'agent' ? me.agentId : undefined })}`)
  let split: Record<string, number> | undefined = metrics?.protocol_split
  let note = 'share of paid transactions, last 24 h (metrics API)'
  if (!split && recent.data) {
    const n = recent.data.transactions.length
    const count = (p: string): number => recent.data!.transactions.filter((t) => t.protocol === p).length
    split = n ? { x402: count('x402') / n, mpp: count('mpp') / n } : { x402: 0, mpp: 0 }
    note = `share of the latest ${n} paid transactions`
  }
  if (!split) return <Loading on={recent.loading} />
  if (Object.values(split).every((f) => !f)) return <p class="muted">No paid transactions to split yet.</p>
  return (
    <div>
      <ul class="split" data-testid="protocol-split">
        {Object.entries(split).map(([p, f]) => (
          <li key={p}>
            <strong>{p}</strong> {Math.round(f * 100)}%
          </li>
        ))}
      </ul>
      <p class="muted">{note}</p>
    </div>
  )
}

function Health() {
  const h = useApi('/v1/health', POLL_MS)
  if (h.error) return <Failure error={h.error} what="Health" />
  if (!h.data) return <Loading on />
  const d = h.data
  return (
    <dl class="facts" data-testid="health">
      <dt>Overall</dt>
      <dd>
        <Status value={d.status} />
      </dd>
      <dt>Store</dt>
      <dd>{d.store.ok ? 'ok' : `not ok (${d.store.status})`}</dd>
      <dt>Chain</dt>
      <dd>{d.chain.ok ? `${d.chain.network}, block ${d.chain.blockNumber}` : `${d.chain.network}: not answering`}</dd>
      <dt>Ledger outbox</dt>
      <dd>
        {d.outbox.pending} record(s) waiting to be sent or confirmed
        {d.outbox.oldestWaitS !== null && d.outbox.oldestWaitS >= 60 ? `; the oldest sent ${d.outbox.oldestWaitS} s ago without a receipt` : ''}
      </dd>
    </dl>
  )
}

export function OverviewPage({ me }: { me: Me }) {
  const h1 = useFocusHeading('overview')
  const { budgets, error } = useBudgets(me)
  const metricsPath = me.kind === 'account' ? '/v1/metrics' : `/v1/agents/${encodeURIComponent(me.agentId)}/metrics`
  const metrics = useApi(`${metricsPath}?metrics=spend,tx_count,protocol_split,spend_series&window=24h`, POLL_MS)
  const rejections = useApi<{ transactions: any[] }>(`/v1/transactions${qs({ status: 'rejected', limit: 5, agentId: me.kind === 'agent' ? me.agentId : undefined })}`, POLL_MS)
  const m = metrics.data?.metrics
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Overview
      </h1>
      <div class="grid">
        <section aria-labelledby="budgets-h" class="card wide">
          <h2 id="budgets-h">Daily budgets</h2>
          <Failure error={error} what="Budgets" />
          <Loading on={!budgets && !error} />
          <div class="bars" data-testid="budgets">
            {budgets?.map((b) => (
              <Bar key={b.agentId} label={b.agentId} used={b.used} cap={b.cap} />
            ))}
          </div>
          {budgets?.length === 0 ? <p class="muted">No agents yet: create one under Agents.</p> : null}
        </section>
        <section aria-labelledby="spend-h" class="card wide">
          <h2 id="spend-h">Spend, last 24 h</h2>
          <Failure error={metrics.error} what="Spend over time" />
          {m ? (
            <>
              <p>
                {m.spend?.total ?? fromUnits(toUnits(0))} USDC in {m.tx_count ?? 0} payment(s)
              </p>
              {m.spend_series ? <SpendChart series={m.spend_series} /> : null}
            </>
          ) : null}
        </section>
        <section aria-labelledby="split-h" class="card">
          <h2 id="split-h">Protocol split</h2>
          <ProtocolSplit metrics={m} me={me} />
        </section>
        <section aria-labelledby="health-h" class="card">
          <h2 id="health-h">Outbox and chain</h2>
          {me.kind === 'account' ? <Health /> : <p class="muted">Shown to the account key.</p>}
        </section>
        <section aria-labelledby="rej-h" class="card wide">
          <h2 id="rej-h">Recent rejections</h2>
          <Failure error={rejections.error} what="Rejections" />
          {rejections.data?.transactions.length === 0 ? <p class="muted">No rejections.</p> : null}
          {rejections.data?.transactions.length ? (
            <Table caption="The latest policy rejections (up to five)" head={['Time', 'Agent', 'Reason', 'Endpoint']}>
              {rejections.data.transactions.map((t) => (
                <tr key={t.id}>
                  <td class="nowrap">
                    <a href={href('tx', t.id)}>{when(t.timestamp)}</a>
                  </td>
                  <td>{t.agentId}</td>
                  <td>{t.reason}</td>
                  <td class="endpoint">{t.endpoint}</td>
                </tr>
              ))}
            </Table>
          ) : null}
          <p>
            <a href={href('events')}>All policy events</a>
          </p>
        </section>
      </div>
    </>
  )
}
