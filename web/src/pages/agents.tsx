import { useState } from 'preact/hooks'
import { api, type ApiError, type Me } from '../api'
import { described, Failure, Field, Loading, Table } from '../components/ui'
import { href, useApi, useFocusHeading, when } from '../hooks'
import { PolicyEditor } from './policy-editor'

function CreateAgent({ onCreated }: { onCreated(): void }) {
  const [id, setId] = useState('')
  const [error, setError] = useState<string>()
  const [created, setCreated] = useState<{ agentId: string; apiKey: string }>()
  const submit = async (e: Event): Promise<void> => {
    e.preventDefault()
    setError(undefined)
    try {
      const a = await api('POST', '/v1/agents', id.trim() ? { agentId: id.trim() } : {})
      // A wallet too, so the agent can pay at once (on the embedded chain the faucet funds it).
      await api('POST', '/v1/wallets', { agentId: a.agentId }).catch(() => undefined)
      setCreated({ agentId: a.agentId, apiKey: a.apiKey })
      setId('')
      onCreated()
    } catch (err) {
      setError((err as ApiError).detail)
    }
  }
  return (
    <section class="card" aria-labelledby="create-h">
      <h2 id="create-h">Create an agent</h2>
      <form onSubmit={submit} class="filters" noValidate>
        <Field id="new-agent" label="Agent id" error={error} hint="Letters, digits, . _ -; empty: generated">
          <input {...described('new-agent', error, true)} value={id} onInput={(e) => setId(e.currentTarget.value)} />
        </Field>
        <div class="actions">
          <button type="submit">Create agent</button>
        </div>
      </form>
      {created ? (
        <div class="notice ok" role="status" data-testid="new-key">
          <p>
            Agent <strong>{created.agentId}</strong> created. Its API key is shown only now; copy it:
          </p>
          <p>
            <code class="secret">{created.apiKey}</code>{' '}
            <button type="button" class="secondary" onClick={() => void navigator.clipboard?.writeText(created.apiKey)}>
              Copy key
            </button>
          </p>
        </div>
      ) : null}
    </section>
  )
}

function Wallet({ agentId, me }: { agentId: string; me: Me }) {
  const w = useApi(`/v1/wallets/${encodeURIComponent(agentId)}`, 10_000)
  const [msg, setMsg] = useState('')
  const act = async (path: string, body: unknown, done: string): Promise<void> => {
    try {
      await api('POST', path, body)
      setMsg(done)
      w.reload()
    } catch (e) {
      setMsg((e as ApiError).detail)
    }
  }
  const missing = (w.error as ApiError | undefined)?.status === 404
  return (
    <section class="card" aria-labelledby="wallet-h">
      <h3 id="wallet-h">Wallet</h3>
      {missing ? <p class="muted">No wallet yet.</p> : <Failure error={w.error} what="Wallet" />}
      {w.data ? (
        <dl class="facts" data-testid="wallet">
          <dt>Address</dt>
          <dd>
            <code class="hash">{w.data.address}</code>
          </dd>
          <dt>Network</dt>
          <dd>{w.data.network}</dd>
          <dt>Balance</dt>
          <dd>{w.data.balance?.usdc ?? '—'} USDC</dd>
        </dl>
      ) : null}
      {me.kind === 'account' && (missing || w.data) ? (
        <div class="actions wallet-actions">
          {missing ? (
            <button type="button" onClick={() => void act('/v1/wallets', { agentId }, 'Wallet created.')}>
              Create wallet
            </button>
          ) : (
            <button type="button" class="secondary" onClick={() => void act(`/v1/wallets/${encodeURIComponent(agentId)}/faucet`, { usdc: '10' }, 'Added 10 test USDC.')}>
              Dev faucet: add 10 USDC
            </button>
          )}
        </div>
      ) : null}
      {msg ? (
        <p class="muted" role="status">
          {msg}
        </p>
      ) : null}
    </section>
  )
}

export function AgentsPage({ me, agentId }: { me: Me; agentId: string | undefined }) {
  const h1 = useFocusHeading(`agents-${agentId}`)
  const list = useApi<{ agents: { agentId: string; createdAt: string }[]; nextCursor: string | null }>(me.kind === 'account' ? '/v1/agents?limit=200' : null)
  const selected = me.kind === 'agent' ? me.agentId : agentId
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Agents
      </h1>
      <div class="grid">
        {me.kind === 'account' ? <CreateAgent onCreated={list.reload} /> : null}
        {me.kind === 'account' ? (
          <section class="card" aria-labelledby="agents-h">
            <h2 id="agents-h">Agents</h2>
            <Failure error={list.error} what="Agents" />
            <Loading on={list.loading && !list.data} />
            {list.data?.agents.length ? (
              <Table caption="Agents of this account" head={['Agent', 'Created']} testid="agents-table">
                {list.data.agents.map((a) => (
                  <tr key={a.agentId}>
                    <td>
                      <a href={href('agents', a.agentId)} aria-current={a.agentId === selected ? 'true' : undefined}>
                        {a.agentId}
                      </a>
                    </td>
                    <td>{when(a.createdAt)}</td>
                  </tr>
                ))}
              </Table>
            ) : list.data ? (
              <p class="muted">No agents yet.</p>
            ) : null}
          </section>
        ) : null}
      </div>
      {selected ? (
        // Keyed by agent: another agent's page starts afresh (no message, form or answer of the last one).
        <section key={selected} aria-labelledby="agent-h" class="agent-detail">
          <h2 id="agent-h">{selected}</h2>
          <div class="grid">
            <Wallet agentId={selected} me={me} />
            <section class="card wide">
              <PolicyEditor agentId={selected} canEdit={me.kind === 'account'} />
            </section>
          </div>
        </section>
      ) : me.kind === 'account' ? (
        <p class="muted">Pick an agent to see its wallet and edit its policy.</p>
      ) : null}
    </>
  )
}
