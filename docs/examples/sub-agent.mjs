// A sub-agent for POST /v1/agents/invoke (Node 20, no dependencies).
// PAYGATE_API=http://127.0.0.1:8403 SUB_AGENT_ID=summarizer SUB_AGENT_KEY=rp_agent_… node sub-agent.mjs
import { createServer } from 'node:http'

const api = process.env.PAYGATE_API ?? 'http://127.0.0.1:8403'
const agentId = process.env.SUB_AGENT_ID
const key = process.env.SUB_AGENT_KEY
const port = Number(process.env.PORT ?? 9000)

/** Pay for one resource inside the invocation: the token makes it count against the cap. */
async function payInside(token, endpoint) {
  const res = await fetch(`${api}/v1/pay`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-paygate-invocation': token },
    body: JSON.stringify({ agentId, endpoint }),
  })
  const body = await res.json()
  if (res.status === 402 && body.error === 'budget_exceeded') return { stopped: body.detail }
  if (!res.ok) throw new Error(`${body.error}: ${body.detail}`)
  return { data: body.data, txHash: body.txHash }
}

createServer(async (req, res) => {
  const chunks = []
  for await (const c of req) chunks.push(c)
  const { task = {} } = JSON.parse(Buffer.concat(chunks).toString() || '{}')
  const token = req.headers['x-paygate-invocation']
  const remaining = req.headers['x-paygate-budget-remaining']
  try {
    const results = []
    for (const source of task.sources ?? []) {
      const r = await payInside(token, source)
      if (r.stopped) break // the cap is reached: answer with what we have
      results.push(r.data)
    }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ output: { results, budgetAtStart: remaining } }))
  } catch (e) {
    res.writeHead(500, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ error: String(e) }))
  }
// Loopback only, like the Python one: only Paygate on this host should reach it.
}).listen(port, '127.0.0.1', () => console.log(`sub-agent on 127.0.0.1:${port}`))
