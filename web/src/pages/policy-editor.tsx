import { useEffect, useState } from 'preact/hooks'
import { api, type ApiError } from '../api'
import { described, Field } from '../components/ui'

const WINDOWS = ['1m', '5m', '15m', '1h', '24h']

interface Form {
  dailyBudget: string
  perCallLimit: string
  allowedDomains: string
  blockedDomains: string
  rateCalls: string
  rateWindow: string
  protocolPreference: string
}

const fromPolicy = (p: any): Form => ({
  dailyBudget: p.dailyBudget ? String(p.dailyBudget.usdc) : '',
  perCallLimit: p.perCallLimit ? String(p.perCallLimit.usdc) : '',
  allowedDomains: (p.allowedDomains ?? []).join('\n'),
  blockedDomains: (p.blockedDomains ?? []).join('\n'),
  rateCalls: p.rateLimit ? String(p.rateLimit.calls) : '',
  rateWindow: p.rateLimit?.window ?? '1h',
  protocolPreference: p.protocolPreference ?? 'auto',
})

const lines = (s: string): string[] =>
  s
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean)

/**
 * The PUT body. Amounts go as the decimal strings typed (the API parses them exactly); an
 * empty field removes the limit (`null`); an empty allow list removes it too.
 */
function toBody(f: Form): Record<string, unknown> {
  const calls = f.rateCalls.trim()
  return {
    dailyBudget: f.dailyBudget.trim() ? { usdc: f.dailyBudget.trim() } : null,
    perCallLimit: f.perCallLimit.trim() ? { usdc: f.perCallLimit.trim() } : null,
    allowedDomains: lines(f.allowedDomains).length ? lines(f.allowedDomains) : null,
    blockedDomains: lines(f.blockedDomains).length ? lines(f.blockedDomains) : null,
    rateLimit: calls ? { calls: /^\d+$/.test(calls) ? Number(calls) : calls, window: f.rateWindow } : null,
    protocolPreference: f.protocolPreference,
  }
}

/** Which form field an API error's `field` (`dailyBudget.usdc`, `allowedDomains[2]`, `rateLimit.window`) belongs to. */
export function fieldOf(apiField: string | undefined): keyof Form | 'form' {
  if (!apiField) return 'form'
  if (apiField.startsWith('dailyBudget')) return 'dailyBudget'
  if (apiField.startsWith('perCallLimit')) return 'perCallLimit'
  if (apiField.startsWith('allowedDomains')) return 'allowedDomains'
  if (apiField.startsWith('blockedDomains')) return 'blockedDomains'
  if (apiField === 'rateLimit.window') return 'rateWindow'
  if (apiField.startsWith('rateLimit')) return 'rateCalls'
  if (apiField.startsWith('protocolPreference')) return 'protocolPreference'
  return 'form'
}

export function PolicyEditor({ agentId, canEdit }: { agentId: string; canEdit: boolean }) {
  const [form, setForm] = useState<Form>()
  const [errors, setErrors] = useState<Partial<Record<keyof Form | 'form', string>>>({})
  const [saved, setSaved] = useState('')
  const [policy, setPolicy] = useState<any>()
  useEffect(() => {
    setForm(undefined)
    api('GET', `/v1/policies/${encodeURIComponent(agentId)}`).then(
      (p) => {
        setPolicy(p)
        setForm(fromPolicy(p))
      },
      (e: ApiError) => setErrors({ form: e.detail }),
    )
  }, [agentId])
  if (!form) return errors.form ? <p class="notice error">{errors.form}</p> : <p class="muted">Loading policy…</p>
  const set = (k: keyof Form) => (e: Event) => setForm({ ...form, [k]: (e.currentTarget as HTMLInputElement).value })
  const save = async (e: Event): Promise<void> => {
    e.preventDefault()
    setSaved('')
    try {
      const p = await api('PUT', `/v1/policies/${encodeURIComponent(agentId)}`, toBody(form))
      setErrors({})
      setPolicy(p)
      setForm(fromPolicy(p))
      setSaved('Policy saved.')
    } catch (err) {
      const ae = err as ApiError
      // The API's detail names the field (`dailyBudget.usdc must not be negative`): named once.
      setErrors({ [fieldOf(ae.field)]: ae.field && !ae.detail.includes(ae.field) ? `${ae.detail} (${ae.field})` : ae.detail })
    }
  }
  const ro = !canEdit
  return (
    <form class="policy" onSubmit={save} aria-labelledby="policy-h" noValidate>
      <h3 id="policy-h">Policy of {agentId}</h3>
      {policy?.dailyBudget || policy?.rateLimit ? (
        <p class="muted" data-testid="policy-usage">
          {[
            policy.dailyBudget ? `Used today: ${policy.dailyBudget.usedToday} of ${policy.dailyBudget.usdc} USDC` : null,
            policy.rateLimit ? `calls this hour: ${policy.rateLimit.usedThisHour} (limit ${policy.rateLimit.calls} per ${policy.rateLimit.window})` : null,
          ]
            .filter(Boolean)
            .join('; ')}
        </p>
      ) : null}
      <div class="form-grid">
        <Field id="p-daily" label="Daily budget (USDC)" error={errors.dailyBudget} hint="Empty: no daily limit">
          <input {...described('p-daily', errors.dailyBudget, true)} inputMode="decimal" value={form.dailyBudget} onInput={set('dailyBudget')} readOnly={ro} />
        </Field>
        <Field id="p-percall" label="Per-call limit (USDC)" error={errors.perCallLimit} hint="Empty: no cap">
          <input {...described('p-percall', errors.perCallLimit, true)} inputMode="decimal" value={form.perCallLimit} onInput={set('perCallLimit')} readOnly={ro} />
        </Field>
        <Field id="p-allowed" label="Allowed domains" error={errors.allowedDomains} hint="One per line; empty: any domain">
          <textarea {...described('p-allowed', errors.allowedDomains, true)} rows={3} value={form.allowedDomains} onInput={set('allowedDomains')} readOnly={ro} />
        </Field>
        <Field id="p-blocked" label="Blocked domains" error={errors.blockedDomains} hint="One per line; wins over allowed">
          <textarea {...described('p-blocked', errors.blockedDomains, true)} rows={3} value={form.blockedDomains} onInput={set('blockedDomains')} readOnly={ro} />
        </Field>
        <Field id="p-calls" label="Rate limit (calls)" error={errors.rateCalls} hint="Empty: no rate limit">
          <input {...described('p-calls', errors.rateCalls, true)} inputMode="numeric" value={form.rateCalls} onInput={set('rateCalls')} readOnly={ro} />
        </Field>
        <Field id="p-window" label="Rate window" error={errors.rateWindow}>
          <select {...described('p-window', errors.rateWindow)} value={form.rateWindow} onChange={set('rateWindow')} disabled={ro}>
            {WINDOWS.map((w) => (
              <option key={w}>{w}</option>
            ))}
          </select>
        </Field>
        <Field id="p-pref" label="Protocol preference" error={errors.protocolPreference}>
          <select {...described('p-pref', errors.protocolPreference)} value={form.protocolPreference} onChange={set('protocolPreference')} disabled={ro}>
            <option>auto</option>
            <option>x402</option>
            <option>mpp</option>
          </select>
        </Field>
      </div>
      {errors.form ? (
        <p class="notice error" role="alert">
          {errors.form}
        </p>
      ) : null}
      {saved ? (
        <p class="notice ok" role="status">
          {saved}
        </p>
      ) : null}
      {canEdit ? <button type="submit">Save policy</button> : <p class="muted">Only the account key can change a policy.</p>}
    </form>
  )
}
