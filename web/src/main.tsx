import { render } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import { api, ApiError, type Me, session } from './api'
import { href, useHashRoute } from './hooks'
import { AgentsPage } from './pages/agents'
import { AlertsPage, DeliveriesPage } from './pages/alerts'
import { EventsPage } from './pages/events'
import { OverviewPage } from './pages/overview'
import { RunsPage, TreePage } from './pages/tree'
import { SettingsPage } from './pages/settings'
import { TransactionsPage } from './pages/transactions'
import { TxPage } from './pages/tx'
import './style.css'

const NAV: [string, string][] = [
  ['overview', 'Overview'],
  ['transactions', 'Transactions'],
  ['events', 'Policy Events'],
  ['tree', 'Cost tree'],
  ['runs', 'Runs'],
  ['agents', 'Agents'],
  ['alerts', 'Alerts'],
  ['deliveries', 'Deliveries'],
  ['settings', 'Settings'],
]

function SignIn({ onSignedIn }: { onSignedIn(me: Me): void }) {
  const [key, setKey] = useState('')
  const [error, setError] = useState<string>()
  const [busy, setBusy] = useState(false)
  const submit = async (e: Event): Promise<void> => {
    e.preventDefault()
    setBusy(true)
    setError(undefined)
    try {
      const me = await api<Me>('GET', '/v1/me', undefined, key.trim())
      session.set(key.trim())
      onSignedIn(me)
    } catch (err) {
      setError(err instanceof ApiError ? err.detail : 'the API did not answer')
    } finally {
      setBusy(false)
    }
  }
  return (
    <main id="main" class="signin">
      <h1>Paygate</h1>
      <form onSubmit={submit} aria-describedby="signin-note">
        <div class="field">
          <label for="api-key">API key</label>
          <input id="api-key" type="password" autocomplete="off" spellcheck={false} value={key} onInput={(e) => setKey(e.currentTarget.value)} required />
        </div>
        <p id="signin-note" class="muted">
          An account key (<code>rp_live_…</code>) sees every agent; an agent key sees its own. The key stays in this tab only (session storage).
        </p>
        {error ? (
          <p class="notice error" role="alert">
            {error}
          </p>
        ) : null}
        <button type="submit" disabled={busy}>
          Sign in
        </button>
      </form>
    </main>
  )
}

function Page({ route, me }: { route: string[]; me: Me }) {
  const [page = 'overview', a, b] = route
  switch (page) {
    case 'transactions':
      return <TransactionsPage me={me} />
    case 'tx':
      return <TxPage id={a ?? ''} />
    case 'events':
      return <EventsPage me={me} />
    case 'tree':
      return <TreePage tx={a} />
    case 'runs':
      return <RunsPage me={me} runId={a} agentId={b} />
    case 'agents':
      return <AgentsPage me={me} agentId={a} />
    case 'alerts':
      return <AlertsPage me={me} />
    case 'deliveries':
      return <DeliveriesPage me={me} />
    case 'settings':
      return <SettingsPage me={me} />
    case 'overview':
      return <OverviewPage me={me} />
    default:
      return (
        <>
          <h1>No such page</h1>
          <p>
            The dashboard has no page <code>#/{route.join('/')}</code>. <a href={href('overview')}>Go to the overview</a>.
          </p>
        </>
      )
  }
}

function App() {
  const [me, setMe] = useState<Me | null | undefined>(undefined)
  const route = useHashRoute()
  useEffect(() => {
    if (!session.key) return setMe(null)
    api<Me>('GET', '/v1/me').then(setMe, () => {
      session.clear()
      setMe(null)
    })
  }, [])
  if (me === undefined) return <p class="muted">Loading…</p>
  if (me === null) return <SignIn onSignedIn={setMe} />
  const current = route[0] ?? 'overview'
  const section = current === 'tx' ? 'transactions' : current
  return (
    <>
      <button type="button" class="skip" onClick={() => document.getElementById('main')?.focus()}>
        Skip to content
      </button>
      <header class="top">
        <span class="brand">Paygate</span>
        <nav aria-label="Dashboard">
          <ul>
            {NAV.map(([id, label]) => (
              <li key={id}>
                <a href={href(id)} aria-current={section === id ? 'page' : undefined}>
                  {label}
                </a>
              </li>
            ))}
          </ul>
        </nav>
        <span class="who" data-testid="who">
          {me.kind === 'account' ? 'Account key' : `Agent key: ${me.agentId}`}
        </span>
        <button
          type="button"
          class="link"
          onClick={() => {
            session.clear()
            setMe(null)
          }}
        >
          Sign out
        </button>
      </header>
      <main id="main" tabIndex={-1}>
        <Page route={route} me={me} />
      </main>
    </>
  )
}

render(<App />, document.getElementById('app')!)
