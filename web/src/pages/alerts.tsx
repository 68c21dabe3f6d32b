import { useState } from 'preact/hooks'
import { api, type ApiError, type Me, qs } from '../api'
import { described, Failure, Field, Loading, Status, Table } from '../components/ui'
import { useApi, useFocusHeading, when } from '../hooks'
import { fieldOf } from './alert-fields'

const TYPES = ['policy_violation', 'budget_pct', 'spend_rate']
const CHANNELS = ['webhook', 'email', 'slack']
const WINDOWS = ['1m', '5m', '15m', '1h', '24h']

function CreateAlert({ me, onCreated }: { me: Me; onCreated(): void }) {
  const [f, setF] = useState({ agentId: me.kind === 'agent' ? me.agentId : '', type: 'policy_violation', threshold: '', window: '1h', channel: 'webhook', target: '' })
  const [errors, setErrors] = useState<Record<string, string>>({})
  const set = (k: keyof typeof f) => (e: Event) => setF({ ...f, [k]: (e.currentTarget as HTMLInputElement).value })
  const [created, setCreated] = useState('')
  const submit = async (e: Event): Promise<void> => {
    e.preventDefault()
    const notify = f.channel === 'email' ? { type: 'email', address: f.target.trim() } : { type: f.channel, url: f.target.trim() }
    const body: Record<string, unknown> = { agentId: f.agentId.trim(), type: f.type, notify }
    if (f.type !== 'policy_violation') body.threshold = Number(f.threshold)
    if (f.type === 'spend_rate') body.window = f.window
    try {
      await api('POST', '/v1/alerts', body)
      setErrors({})
      setCreated(`Alert created for ${body.agentId}.`)
      setF({ ...f, threshold: '', target: '' })
      onCreated()
    } catch (err) {
      const ae = err as ApiError
      // The API's detail names the field: named once.
      setCreated('')
      setErrors({ [fieldOf(ae.field)]: ae.field && !ae.detail.includes(ae.field) ? `${ae.detail} (${ae.field})` : ae.detail })
    }
  }
  return (
    <form class="card" onSubmit={submit} aria-labelledby="new-alert-h" noValidate>
      <h2 id="new-alert-h">Create an alert</h2>
      <div class="form-grid">
        <Field id="a-agent" label="Agent" error={errors.agentId}>
          <input {...described('a-agent', errors.agentId)} value={f.agentId} onInput={set('agentId')} readOnly={me.kind === 'agent'} />
        </Field>
        <Field id="a-type" label="Type" error={errors.type}>
          <select {...described('a-type', errors.type)} value={f.type} onChange={set('type')}>
            {TYPES.map((t) => (
              <option key={t}>{t}</option>
            ))}
          </select>
        </Field>
        {f.type !== 'policy_violation' ? (
          <Field id="a-threshold" label={f.type === 'budget_pct' ? 'Threshold (% of daily budget)' : 'Threshold (USDC)'} error={errors.threshold}>
            <input {...described('a-threshold', errors.threshold)} inputMode="decimal" value={f.threshold} onInput={set('threshold')} />
          </Field>
        ) : null}
        {f.type === 'spend_rate' ? (
          <Field id="a-window" label="Window" error={errors.window}>
            <select {...described('a-window', errors.window)} value={f.window} onChange={set('window')}>
              {WINDOWS.map((w) => (
                <option key={w}>{w}</option>
              ))}
            </select>
          </Field>
        ) : null}
        <Field id="a-channel" label="Channel" error={errors.channel}>
          <select {...described('a-channel', errors.channel)} value={f.channel} onChange={set('channel')}>
            {CHANNELS.map((c) => (
              <option key={c}>{c}</option>
            ))}
          </select>
        </Field>
        <Field id="a-target" label={f.channel === 'email' ? 'E-mail address' : 'URL'} error={errors.target}>
          <input {...described('a-target', errors.target)} value={f.target} onInput={set('target')} />
        </Field>
      </div>
      {errors.form ? (
        <p class="notice error" role="alert">
          {errors.form}
        </p>
      ) : null}
      <button type="submit">Create alert</button>
      {created ? (
        <p class="muted" role="status">
          {created}
        </p>
      ) : null}
    </form>
  )
}

export function AlertsPage({ me }: { me: Me }) {
  const h1 = useFocusHeading('alerts')
  const list = useApi(`/v1/alerts${qs({ agentId: me.kind === 'agent' ? me.agentId : undefined })}`)
  const [msg, setMsg] = useState({ text: '', ok: true })
  const act = async (method: string, path: string, done: string): Promise<void> => {
    try {
      await api(method, path)
      setMsg({ text: done, ok: true })
      list.reload()
    } catch (e) {
      setMsg({ text: (e as ApiError).detail, ok: false })
    }
  }
  const alerts: any[] | undefined = list.data?.alerts
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Alerts
      </h1>
      <Failure error={list.error} what="Alerts" />
      {list.error ? null : (
        <>
          {me.kind === 'account' ? <CreateAlert me={me} onCreated={list.reload} /> : null}
          <Loading on={list.loading && !list.data} />
          {msg.text ? (
            <p class={`notice ${msg.ok ? 'ok' : 'error'}`} role="status">
              {msg.text}
            </p>
          ) : null}
          {alerts?.length ? (
            <Table caption="Alerts" head={['Agent', 'Type', 'Threshold', 'Channel', 'Created', 'Actions']} testid="alerts-table">
              {alerts.map((a) => (
                <tr key={a.alertId}>
                  <td>{a.agentId}</td>
                  <td>{a.type}</td>
                  <td class="nowrap">
                    {a.threshold === undefined ? '—' : a.type === 'budget_pct' ? `${a.threshold}% of the daily budget` : `${a.threshold} USDC${a.window ? ` per ${a.window}` : ''}`}
                  </td>
                  <td class="endpoint">
                    {a.notify?.type}: {a.notify?.url ?? a.notify?.address}
                  </td>
                  <td>{when(a.createdAt)}</td>
                  <td class="row-actions">
                    <button
                      type="button"
                      class="secondary"
                      onClick={() => void act('POST', `/v1/alerts/${encodeURIComponent(a.alertId)}/test`, `Test event sent to the ${a.notify?.type} of ${a.agentId}'s ${a.type} alert.`)}
                    >
                      Test
                    </button>
                    {me.kind === 'account' ? (
                      <button type="button" class="danger" onClick={() => void act('DELETE', `/v1/alerts/${encodeURIComponent(a.alertId)}`, `Alert ${a.alertId} deleted.`)}>
                        Delete
                      </button>
                    ) : null}
                  </td>
                </tr>
              ))}
            </Table>
          ) : alerts ? (
            <p class="muted">No alerts yet.</p>
          ) : null}
        </>
      )}
    </>
  )
}

const DELIVERY_STATUSES = ['', 'pending', 'delivered', 'retrying', 'dropped']

export function DeliveriesPage({ me }: { me: Me }) {
  const h1 = useFocusHeading('deliveries')
  const [status, setStatus] = useState('')
  const list = useApi(`/v1/deliveries${qs({ status, agentId: me.kind === 'agent' ? me.agentId : undefined })}`, 5000)
  const [msg, setMsg] = useState({ text: '', ok: true })
  const retry = async (id: string): Promise<void> => {
    try {
      await api('POST', `/v1/deliveries/${encodeURIComponent(id)}/retry`)
      setMsg({ text: `Delivery ${id} queued again.`, ok: true })
      list.reload()
    } catch (e) {
      setMsg({ text: (e as ApiError).detail, ok: false })
    }
  }
  const rows: any[] | undefined = list.data?.deliveries
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Deliveries
      </h1>
      <form class="filters" aria-label="Delivery filters" onSubmit={(e) => e.preventDefault()}>
        <div class="field">
          <label for="d-status">Status</label>
          <select id="d-status" value={status} onChange={(e) => setStatus(e.currentTarget.value)}>
            {DELIVERY_STATUSES.map((s) => (
              <option key={s} value={s}>
                {s || 'any'}
              </option>
            ))}
          </select>
        </div>
      </form>
      <Failure error={list.error} what="Delivery log" />
      <Loading on={list.loading && !list.data} />
      {msg.text ? (
        <p class={`notice ${msg.ok ? 'ok' : 'error'}`} role="status">
          {msg.text}
        </p>
      ) : null}
      {rows?.length ? (
        <Table caption="Webhook and notification deliveries, newest first" head={['Delivery', 'Event', 'Agent', 'Status', 'Attempts', 'Actions']} testid="deliveries-table">
          {rows.map((d) => {
            const id = d.deliveryId ?? d.id
            const attempts: any[] = d.attempts ?? []
            return (
              <tr key={id}>
                <td>
                  <code>{id}</code>
                </td>
                <td>{d.event}</td>
                <td>{d.agentId}</td>
                <td>
                  <Status value={d.status} />
                </td>
                <td>
                  <ul class="attempts">
                    {attempts.map((a, i) => (
                      <li key={i}>
                        {when(a.at ?? a.time ?? a.timestamp)}: {a.statusCode ?? a.status ?? '—'} {a.error ?? ''}
                      </li>
                    ))}
                  </ul>
                </td>
                <td>
                  {d.status === 'dropped' && me.kind === 'account' ? (
                    <button type="button" class="secondary" onClick={() => void retry(id)}>
                      Retry
                    </button>
                  ) : null}
                </td>
              </tr>
            )
          })}
        </Table>
      ) : rows ? (
        <p class="muted">No deliveries.</p>
      ) : null}
    </>
  )
}
