import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { axeViolations, dashboardGateway, openBrowser, signIn, visit } from '../helpers/browser.js'

/**
 * Moving between the dashboard's pages: a page never shows the last page's answer under its
 * own error, an unknown route says so, and pages read what they show (a budget's small use,
 * a policy without limits, a tree opened by transaction id, an invocation's root).
 */
const { gw, merchant } = await dashboardGateway(t)
for (const agentId of ['rich', 'plain']) await gw.api('POST', '/v1/wallets', { body: { agentId } })
await gw.api('PUT', '/v1/policies/rich', { body: { dailyBudget: { usdc: 5 }, rateLimit: { calls: 100, window: '1h' } } })
const paid = await gw.api('POST', '/v1/pay', { body: { agentId: 'rich', endpoint: `${merchant.url}/paid`, method: 'GET' } })
await gw.api('POST', '/v1/pay', { body: { agentId: 'plain', endpoint: `${merchant.url}/paid`, method: 'GET' } })
await gw.api('POST', '/v1/agents', { body: { agentId: 'nowallet' } })
// A sub-agent that answers at once (it pays nothing): its invocation's root is all the tree holds.
const sub = createServer((req, res) => {
  req.resume()
  req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"output":"done"}'))
})
await new Promise<void>((r) => sub.listen(0, '127.0.0.1', r))
t.teardown(() => new Promise<void>((r) => sub.close(() => r())))
const invoked = await gw.api('POST', '/v1/agents/invoke', {
  headers: { 'x-agent-id': 'rich' },
  body: { agentEndpoint: `http://127.0.0.1:${(sub.address() as AddressInfo).port}/task`, task: { q: 1 }, budget: { usdc: 0.05 } },
})

const { page } = await openBrowser(t, gw.url)
await signIn(page, gw.url, gw.accountKey)

t.test('a page whose load fails shows its error, never the last page it replaced', async (t) => {
  t.equal(paid.status, 200, 'setup: rich paid')
  await visit(page, gw.url, 'agents/rich', 'Agents')
  await page.getByTestId('wallet').waitFor()
  await page.goto(`${gw.url}/ui/#/agents/nowallet`)
  await page.getByText('No wallet yet.').waitFor()
  t.equal(await page.getByTestId('wallet').count(), 0, "no other agent's wallet under 'No wallet yet.'")
  t.equal(await page.getByRole('button', { name: /Dev faucet/ }).count(), 0, 'and no faucet for it')
  await page.goto(`${gw.url}/ui/#/tx/${paid.body.transactionId}`)
  await page.getByTestId('tx-facts').waitFor()
  await page.goto(`${gw.url}/ui/#/tx/tx_doesnotexist`)
  await page.getByText(/does not exist/).waitFor()
  t.equal(await page.getByTestId('tx-facts').count(), 0, "the last transaction's facts are gone")
})

t.test('an unknown route says there is no such page', async (t) => {
  await visit(page, gw.url, 'nosuchpage', 'No such page')
  t.match(await page.locator('main').textContent(), /no page #\/nosuchpage/)
  t.same(await axeViolations(page), [])
})

t.test('the dashboard has its own icon (no request for a missing /favicon.ico)', async (t) => {
  const icon = await page.locator('link[rel="icon"]').getAttribute('href')
  t.match(icon, /^\/ui\/assets\/favicon-[\w-]+\.svg$/)
  const res = await fetch(new URL(icon!, gw.url))
  t.same([res.status, res.headers.get('content-type')], [200, 'image/svg+xml'])
  t.match(await res.text(), /^<svg /)
})

t.test('budgets and policies: a little spend shows, limits an agent has not are not shown as 0', async (t) => {
  await visit(page, gw.url, 'overview', 'Overview')
  const bars = page.getByTestId('budgets')
  await bars.getByText('rich').waitFor()
  t.match(await bars.textContent(), /0\.01 \/ 5 USDC \(<1%\)/, '0.2% of the budget is not shown as 0%')
  await visit(page, gw.url, 'agents/rich', 'Agents')
  t.match(await page.getByTestId('policy-usage').textContent(), /Used today: 0\.01 of 5 USDC; calls this hour: 1 \(limit 100 per 1h\)/)
  await page.goto(`${gw.url}/ui/#/agents/plain`)
  await page.getByRole('heading', { name: 'Policy of plain' }).waitFor()
  t.equal(await page.getByTestId('policy-usage').count(), 0, 'no budget and no rate limit: no usage line of zeros')
})

t.test('a cost tree opened by transaction id marks that transaction', async (t) => {
  await visit(page, gw.url, `tree/${paid.body.transactionId}`, 'Cost tree')
  await page.getByTestId('tree').waitFor()
  await page.getByText('(this transaction)').waitFor()
  t.equal(await page.getByLabel('Transaction (ledger hash or id)').inputValue(), paid.body.transactionId)
  await page.goto(`${gw.url}/ui/#/tree/${paid.body.txHash}`)
  await page.getByText('(this transaction)').waitFor()
  t.equal(await page.getByLabel('Transaction (ledger hash or id)').inputValue(), paid.body.txHash, 'the field follows the page')
})

t.test("an invocation's root is named as one: in the list, on its page (with its tree) and in its tree", async (t) => {
  t.equal(invoked.status, 200, JSON.stringify(invoked.body))
  await visit(page, gw.url, `tx/${invoked.body.txHash}`, 'Transaction')
  await page.getByRole('heading', { level: 2, name: 'Invocation' }).waitFor()
  t.equal(await page.getByText('Quoted').count(), 0, 'no price quoted for an invocation')
  await page.getByRole('link', { name: 'Open its cost tree' }).click()
  await page.getByTestId('tree').waitFor()
  t.match(await page.getByTestId('tree').textContent(), /rich\s*invocation/)
  await visit(page, gw.url, 'transactions', 'Transactions')
  const root = (await gw.api('GET', `/v1/transactions/${invoked.body.txHash}`)).body
  const row = page.locator(`[data-tx="${root.id}"]`)
  await row.waitFor()
  t.match(await row.textContent(), /invocation/)
})
