import t, { type Test } from 'tap'
import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { fileURLToPath } from 'node:url'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'

/**
 * The documented sub-agent examples (docs/examples/, Node and Python) run as they are against a
 * real gateway: each pays a merchant per source with the invocation's token and stops at the cap.
 */
const gw = await startTestGateway()
t.teardown(() => gw.close())
const { merchantOptions } = await testChain(gw)
const m = await startV2Merchant(await merchantOptions(10_000n))
t.teardown(() => m.close())
const key = (await gw.api('POST', '/v1/agents', { body: { agentId: 'example' } })).body.apiKey as string
await gw.api('POST', '/v1/wallets', { body: { agentId: 'example' } })
await gw.api('POST', '/v1/agents', { body: { agentId: 'boss' } })
await gw.api('POST', '/v1/wallets', { body: { agentId: 'boss' } })

const freePort = (): Promise<number> =>
  new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number }
      s.close(() => resolve(port))
    })
  })

async function runExample(t: Test, cmd: string, file: string): Promise<string> {
  const port = await freePort()
  const proc = spawn(cmd, [fileURLToPath(new URL(`../../docs/examples/${file}`, import.meta.url))], {
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', PAYGATE_API: gw.url, SUB_AGENT_ID: 'example', SUB_AGENT_KEY: key, PORT: String(port) },
    stdio: 'ignore',
  })
  t.teardown(() => {
    proc.kill('SIGKILL')
  })
  // Ready when it accepts a connection (bounded: 50 tries).
  for (let i = 0; i < 50; i++) {
    const up = await fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{}' }).then(
      () => true,
      () => false,
    )
    if (up) break
    await new Promise((r) => setTimeout(r, 100))
  }
  return `http://127.0.0.1:${port}/task`
}

for (const [cmd, file] of [
  [process.execPath, 'sub-agent.mjs'],
  ['python3', 'sub_agent.py'],
] as const) {
  t.test(`${file}: pays per source with the token and stops at the cap`, async (t) => {
    const url = await runExample(t, cmd, file)
    const r = await gw.api('POST', '/v1/agents/invoke', {
      headers: { 'x-agent-id': 'boss' },
      body: { agentEndpoint: url, task: { sources: [`${m.url}/paid`, `${m.url}/paid`, `${m.url}/paid`] }, budget: { usdc: 0.025 } },
    })
    t.equal(r.status, 200, r.text)
    t.equal(r.body.output.results.length, 2, 'the third source is over the cap')
    t.equal(r.body.output.budgetAtStart, '0.025')
    t.same(r.body.totalCost, { usdc: 0.02 })
    t.equal(r.body.paymentChain.length, 2)
    // 127.0.0.2 is loopback too, but not the address it binds: one listening on all interfaces would answer there.
    const other = await fetch(url.replace('127.0.0.1', '127.0.0.2'), { method: 'POST', body: '{}' }).then(
      () => 'answered',
      () => 'refused',
    )
    t.equal(other, 'refused', 'it listens on 127.0.0.1 only')
  })
}

t.test('invocation.md names exactly the environment variables the examples read', async (t) => {
  const doc = readFileSync(new URL('../../docs/invocation.md', import.meta.url), 'utf8')
  const sentence = /Both read ([\s\S]*?)\s+from the environment/.exec(doc)
  t.ok(sentence, 'the sentence is there')
  const named = [...(sentence?.[1] ?? '').matchAll(/`([A-Z_]+)`/g)].map((m) => m[1]).sort()
  for (const file of ['sub-agent.mjs', 'sub_agent.py']) {
    const src = readFileSync(new URL(`../../docs/examples/${file}`, import.meta.url), 'utf8')
    const read = [...src.matchAll(/process\.env\.([A-Z_]+)|os\.environ(?:\.get\(|\[)"([A-Z_]+)"/g)].map((m) => m[1] ?? m[2])
    t.same([...new Set(read)].sort(), named, file)
  }
})
