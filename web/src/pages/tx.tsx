import type { ComponentChildren } from 'preact'
import { usdc } from '../api'
import { Failure, Loading, Status } from '../components/ui'
import { href, useApi, useFocusHeading, when } from '../hooks'

const Row = ({ k, children }: { k: string; children: ComponentChildren }) => (
  <>
    <dt>{k}</dt>
    <dd>{children}</dd>
  </>
)

/** One transaction with its on-chain ledger record; polled while the record is not final. */
export function TxPage({ id }: { id: string }) {
  const h1 = useFocusHeading(`tx-${id}`)
  const tx = useApi(`/v1/transactions/${encodeURIComponent(id)}`, 3000)
  const t = tx.data
  const invocation = t?.kind === 'invocation'
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Transaction
      </h1>
      <p>
        <a href={href('transactions')}>Back to transactions</a>
      </p>
      <Failure error={tx.error} what="Transaction" />
      <Loading on={tx.loading && !t} />
      {t ? (
        <div class="grid">
          <section class="card" aria-labelledby="tx-h">
            <h2 id="tx-h">{invocation ? 'Invocation' : 'Payment'}</h2>
            <dl class="facts" data-testid="tx-facts">
              <Row k="Id">
                <code>{t.id}</code>
              </Row>
              <Row k="Time">{when(t.timestamp)}</Row>
              <Row k="Agent">{t.agentId}</Row>
              <Row k="Status">
                <Status value={t.status} />
              </Row>
              {invocation ? null : (
                <>
                  <Row k="Protocol">{t.protocol ?? '—'}</Row>
                  {t.rail ? <Row k="Rail">{t.rail}</Row> : null}
                  <Row k="Paid">{usdc(t.amountPaid)}</Row>
                  <Row k="Quoted">{usdc(t.amountQuoted)}</Row>
                </>
              )}
              {t.endpoint ? (
                <Row k="Endpoint">
                  <span class="endpoint">
                    {t.method} {t.endpoint}
                  </span>
                </Row>
              ) : null}
              {t.invocationId ? (
                <Row k="Invocation">
                  <code>{t.invocationId}</code>
                </Row>
              ) : null}
              {t.upstreamStatus !== undefined ? <Row k="Upstream status">{t.upstreamStatus}</Row> : null}
              {t.reason ? <Row k="Reason">{t.reason}</Row> : null}
              {t.detail ? <Row k="Detail">{t.detail}</Row> : null}
              {t.error ? <Row k="Error">{t.error}</Row> : null}
              {t.payTo ? (
                <Row k="Paid to">
                  <code>{t.payTo}</code> on {t.network}
                </Row>
              ) : null}
              {t.settlement?.transaction ? (
                <Row k="Settlement">
                  <code>{t.settlement.transaction}</code>
                </Row>
              ) : null}
            </dl>
          </section>
          <section class="card" aria-labelledby="ledger-h">
            <h2 id="ledger-h">On-chain ledger record</h2>
            {t.ledger ? (
              <dl class="facts" data-testid="ledger">
                <Row k="Ledger status">
                  <Status value={t.ledger.status} />
                </Row>
                <Row k="Block">{t.ledger.blockNumber ?? '—'}</Row>
                <Row k="Ledger transaction">
                  <code class="hash">{t.txHash}</code>
                </Row>
              </dl>
            ) : (
              <p class="muted">{invocation ? 'An invocation moves no money itself: what its sub-agent paid is in its cost tree.' : 'No ledger record: nothing was paid.'}</p>
            )}
            {t.txHash && (invocation || t.status === 'paid' || t.status === 'unknown') ? (
              <p>
                <a href={href('tree', t.txHash)}>Open its cost tree</a>
              </p>
            ) : null}
            {t.parentTxHash ? (
              <p>
                Under <a href={href('tree', t.parentTxHash)}>{t.parentTxHash.slice(0, 18)}…</a> (depth {t.depth})
              </p>
            ) : null}
          </section>
        </div>
      ) : null}
    </>
  )
}
