import { useState } from 'preact/hooks'
import { api, type ApiError, type Me } from '../api'
import { Failure, Loading } from '../components/ui'
import { useApi, useFocusHeading } from '../hooks'

function WebhookSecret() {
  const [secret, setSecret] = useState<string>()
  const [error, setError] = useState<ApiError>()
  const [msg, setMsg] = useState('')
  const call = async (method: string, path: string, done: string): Promise<void> => {
    try {
      const r = await api<{ secret: string }>(method, path)
      setSecret(r.secret)
      setError(undefined)
      setMsg(done)
    } catch (e) {
      setError(e as ApiError)
    }
  }
  return (
    <section class="card" aria-labelledby="secret-h">
      <h2 id="secret-h">Webhooks</h2>
      <p class="muted">
        Deliveries are signed with <code>X-Service-Signature: sha256=&lt;hex HMAC-SHA256 of the body&gt;</code> keyed with this secret.
      </p>
      <Failure error={error} what="Webhook secret" />
      {secret ? (
        <p>
          <code class="secret" data-testid="webhook-secret">
            {secret}
          </code>
        </p>
      ) : null}
      <div class="actions">
        {secret ? (
          <button
            type="button"
            class="secondary"
            onClick={() => {
              setSecret(undefined)
              setMsg('')
            }}
          >
            Hide secret
          </button>
        ) : (
          <button type="button" class="secondary" onClick={() => void call('GET', '/v1/settings/webhooks', '')}>
            Reveal secret
          </button>
        )}
        <button type="button" class="danger" onClick={() => void call('POST', '/v1/settings/webhooks/rotate', 'Rotated: the new secret signs every delivery from now on.')}>
          Rotate secret
        </button>
      </div>
      {msg ? (
        <p class="notice ok" role="status">
          {msg}
        </p>
      ) : null}
    </section>
  )
}

function Certificate() {
  return (
    <section class="card wide" aria-labelledby="ca-h">
      <h2 id="ca-h">CA certificate</h2>
      <p>Agents that use the proxy for HTTPS must trust Paygate's interception CA.</p>
      <p>
        <a class="button" href="/v1/ca.pem" download="paygate-ca.pem" data-testid="ca-download">
          Download paygate-ca.pem
        </a>
      </p>
      <h3>Trust it, per runtime</h3>
      <dl class="recipes">
        <dt>curl</dt>
        <dd>
          <code>curl --cacert paygate-ca.pem -x "$HTTPS_PROXY" https://…</code>
        </dd>
        <dt>Node.js</dt>
        <dd>
          <code>NODE_EXTRA_CA_CERTS=paygate-ca.pem</code>; for <code>fetch</code> also <code>setGlobalDispatcher(new EnvHttpProxyAgent())</code> from undici
        </dd>
        <dt>Python requests</dt>
        <dd>
          <code>REQUESTS_CA_BUNDLE=paygate-bundle.pem</code> (system roots plus the CA: <code>npm start --silent -- ca --bundle &gt; paygate-bundle.pem</code>)
        </dd>
        <dt>Go</dt>
        <dd>
          <code>SSL_CERT_FILE=paygate-bundle.pem</code>
        </dd>
        <dt>Java</dt>
        <dd>
          <code>keytool -importcert -noprompt -alias paygate -file paygate-ca.pem -keystore paygate.jks -storepass changeit</code>, then{' '}
          <code class="nowrap">-Djavax.net.ssl.trustStore=paygate.jks</code>
        </dd>
        <dt>Debian / Ubuntu system store</dt>
        <dd>
          <code>cp paygate-ca.pem /usr/local/share/ca-certificates/paygate.crt &amp;&amp; update-ca-certificates</code>
        </dd>
      </dl>
      <p class="muted">The repository's docs/proxy.md has the full recipes.</p>
    </section>
  )
}

function ChainInfo() {
  const chain = useApi('/v1/chain', 10_000)
  return (
    <section class="card" aria-labelledby="chain-h">
      <h2 id="chain-h">Chain</h2>
      <Failure error={chain.error} what="Chain" />
      <Loading on={chain.loading && !chain.data} />
      {chain.data ? (
        <dl class="facts" data-testid="chain">
          <dt>Network</dt>
          <dd>
            {chain.data.network} (chain id {chain.data.chainId})
          </dd>
          <dt>Block</dt>
          <dd>{chain.data.blockNumber}</dd>
          <dt>Token</dt>
          <dd>
            <code class="hash">{chain.data.token}</code>
          </dd>
          <dt>Ledger contract</dt>
          <dd>
            <code class="hash">{chain.data.ledger}</code>
          </dd>
          <dt>RPC</dt>
          <dd>
            <code>{chain.data.rpcUrl}</code>
          </dd>
        </dl>
      ) : null}
    </section>
  )
}

export function SettingsPage({ me }: { me: Me }) {
  const h1 = useFocusHeading('settings')
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Settings
      </h1>
      <div class="grid">
        {me.kind === 'account' ? <WebhookSecret /> : null}
        {me.kind === 'account' ? <ChainInfo /> : null}
        <Certificate />
      </div>
      {me.kind === 'agent' ? <p class="muted">Webhook and chain settings are shown to the account key.</p> : null}
    </>
  )
}
