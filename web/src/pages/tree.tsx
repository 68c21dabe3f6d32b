import { useEffect, useState } from 'preact/hooks'
import { type Me, qs, usdc } from '../api'
import { Failure, Loading, Status, Table } from '../components/ui'
import { fromUnits, href, toUnits, useApi, useFocusHeading, when } from '../hooks'

interface TreeNode {
  txHash: string
  agentId: string
  amountPaid: { usdc: number | string }
  depth: number
  status?: string
  protocol?: string
  endpoint?: string
  kind?: 'invocation'
  children: TreeNode[]
}

/** What a subtree cost, paid nodes only (held ones count once they settle), in base units. */
function subtreeUnits(n: TreeNode): bigint {
  const own = n.status === undefined || n.status === 'paid' ? toUnits(n.amountPaid.usdc) : 0n
  return n.children.reduce((s, c) => s + subtreeUnits(c), own)
}

function Node({ node, focus }: { node: TreeNode; focus: string }) {
  const [open, setOpen] = useState(true)
  const mine = node.txHash.toLowerCase() === focus.toLowerCase()
  const id = `node-${node.txHash}`
  return (
    <li class={mine ? 'focus-node' : undefined} data-node={node.txHash}>
      <div class="node">
        {node.children.length ? (
          <button type="button" class="toggle" aria-expanded={open} aria-controls={id} onClick={() => setOpen(!open)}>
            <span aria-hidden="true">{open ? '▾' : '▸'}</span>
            <span class="sr-only">{open ? 'Collapse' : 'Expand'}</span>
          </button>
        ) : (
          <span class="toggle-space" aria-hidden="true" />
        )}
        <span class="node-agent">{node.agentId}</span>
        {node.kind === 'invocation' ? <span class="muted">invocation</span> : <span class="num">{usdc(node.amountPaid)}</span>}
        {node.children.length ? <span class="muted">subtree {fromUnits(subtreeUnits(node))} USDC</span> : null}
        {node.status && node.status !== 'paid' ? <Status value={node.status} /> : null}
        {node.protocol ? <span class="muted">{node.protocol}</span> : null}
        {node.endpoint ? <span class="endpoint muted">{node.endpoint}</span> : null}
        <a href={href('tx', node.txHash)} aria-label={`Transaction ${node.txHash.slice(0, 10)}`}>
          {node.txHash.slice(0, 10)}…
        </a>
        {mine ? <strong class="here">(this transaction)</strong> : null}
      </div>
      {node.children.length && open ? (
        <ul id={id}>
          {node.children.map((c) => (
            <Node key={c.txHash} node={c} focus={focus} />
          ))}
        </ul>
      ) : null}
    </li>
  )
}

/** The whole cost tree a transaction is in, from any node (root, middle or leaf). */
export function TreePage({ tx }: { tx: string | undefined }) {
  const h1 = useFocusHeading(`tree-${tx}`)
  const [input, setInput] = useState(tx ?? '')
  // The field follows the page (a link from elsewhere opens another tree).
  useEffect(() => setInput(tx ?? ''), [tx])
  const tree = useApi(tx ? `/v1/transactions/${encodeURIComponent(tx)}/tree` : null)
  // Nodes carry ledger hashes: a tree opened by transaction id marks its node by the record's hash.
  const byId = useApi<{ txHash: string | null }>(tx?.startsWith('tx_') ? `/v1/transactions/${encodeURIComponent(tx)}` : null)
  const focus = tx?.startsWith('tx_') ? (byId.data?.txHash ?? '') : (tx ?? '')
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        Cost tree
      </h1>
      <form
        class="filters"
        aria-label="Open a cost tree"
        onSubmit={(e) => {
          e.preventDefault()
          if (input.trim()) location.hash = href('tree', input.trim())
        }}
      >
        <div class="field grow">
          <label for="tree-tx">Transaction (ledger hash or id)</label>
          <input id="tree-tx" value={input} onInput={(e) => setInput(e.currentTarget.value)} spellcheck={false} />
        </div>
        <div class="actions">
          <button type="submit">Open tree</button>
        </div>
      </form>
      {!tx ? <p class="muted">Open a tree from any transaction: its page links here.</p> : null}
      <Failure error={tree.error} what="Cost tree" />
      <Loading on={tree.loading && !tree.data} />
      {tree.data ? (
        <section aria-labelledby="tree-h" class="card">
          <h2 id="tree-h">
            Total {usdc(tree.data.totalCost)}: the root and {tree.data.txCount} payment(s) below it
          </h2>
          {tree.data.truncated ? <p class="notice">The tree is larger than shown (truncated).</p> : null}
          <ul class="tree" data-testid="tree">
            <Node node={tree.data.root} focus={focus} />
          </ul>
        </section>
      ) : null}
    </>
  )
}

/** Runs (`GET /v1/runs?agentId=`) and one run's invocations and total cost. */
export function RunsPage({ me, runId, agentId }: { me: Me; runId: string | undefined; agentId: string | undefined }) {
  const h1 = useFocusHeading(`runs-${runId}`)
  const [agent, setAgent] = useState(me.kind === 'agent' ? me.agentId : (agentId ?? ''))
  const [applied, setApplied] = useState(agent)
  const list = useApi(!runId && applied ? `/v1/runs${qs({ agentId: applied })}` : null)
  const run = useApi(runId && agentId ? `/v1/runs/${encodeURIComponent(runId)}${qs({ agentId })}` : null)
  // The account's agents, offered in the field (an orchestrator is one of them).
  const agents = useApi<{ agents: { agentId: string }[] }>(me.kind === 'account' && !runId ? '/v1/agents?limit=200' : null)
  return (
    <>
      <h1 ref={h1} tabIndex={-1}>
        {runId ? `Run ${runId}` : 'Runs'}
      </h1>
      {runId ? (
        <p>
          <a href={href('runs')}>All runs</a>
        </p>
      ) : (
        <form
          class="filters"
          aria-label="Runs of an agent"
          onSubmit={(e) => {
            e.preventDefault()
            setApplied(agent.trim())
          }}
        >
          <div class="field">
            <label for="runs-agent">Orchestrator agent (the one that called POST /v1/agents/invoke)</label>
            <input id="runs-agent" list="runs-agents" value={agent} onInput={(e) => setAgent(e.currentTarget.value)} readOnly={me.kind === 'agent'} required />
            <datalist id="runs-agents">
              {(agents.data?.agents ?? []).map((a) => (
                <option key={a.agentId} value={a.agentId} />
              ))}
            </datalist>
          </div>
          <div class="actions">
            <button type="submit">Show runs</button>
          </div>
        </form>
      )}
      <Failure error={list.error ?? run.error} what="Runs" />
      <Loading on={list.loading || run.loading} />
      {list.data ? (
        (list.data.runs ?? []).length ? (
          <Table caption={`Runs of ${applied}`} head={['Run', 'Started']} testid="runs-table">
            {list.data.runs.map((r: any) => (
              <tr key={r.runId}>
                <td>
                  <a href={href('runs', r.runId, r.agentId ?? applied)}>{r.runId}</a>
                </td>
                <td>{when(r.createdAt)}</td>
              </tr>
            ))}
          </Table>
        ) : (
          <p class="muted">No runs for {applied}.</p>
        )
      ) : null}
      {run.data ? (
        <section class="card" aria-labelledby="run-h">
          <h2 id="run-h">
            Total {usdc(run.data.totalCost)} in {run.data.txCount} payment(s)
          </h2>
          <Table caption="Invocations of this run" head={['Invocation', 'Sub-agent', 'Status', 'Budget', 'Cost']}>
            {(run.data.invocations ?? []).map((i: any) => (
              <tr key={i.invocationId ?? i.txHash}>
                <td>{i.txHash ? <a href={href('tree', i.txHash)}>{String(i.txHash).slice(0, 18)}…</a> : (i.invocationId ?? '—')}</td>
                <td class="endpoint">{i.agentEndpoint ?? '—'}</td>
                <td>{i.status ? <Status value={i.status} /> : '—'}</td>
                <td class="num">{usdc(i.budget)}</td>
                <td class="num">{usdc(i.totalCost)}</td>
              </tr>
            ))}
          </Table>
        </section>
      ) : null}
    </>
  )
}
