import t from 'tap'
import { readFileSync } from 'node:fs'
import { axeViolations, dashboardGateway, openBrowser, shoot, signIn, visit } from '../helpers/browser.js'

/**
 * The dashboard in Debian's Chromium against a real gateway, a real x402 merchant and the
 * embedded chain: sign-in with each key kind, live transactions, policy events, a cost tree
 * from a leaf, the policy editor's validation messages, settings; every request stays on the
 * gateway's loopback origin, axe finds nothing serious, screenshots at 1280 and 390 px.
 */
const { gw, merchant } = await dashboardGateway(t)
const host = new URL(merchant.url).hostname

async function agent(id: string, policy?: object): Promise<string> {
  const key = (await gw.api('POST', '/v1/agents', { body: { agentId: id } })).body.apiKey
  await gw.api('POST', '/v1/wallets', { body: { agentId: id } })
  if (policy) await gw.api('PUT', `/v1/policies/${id}`, { body: policy })
  return key
}
const pay = async (agentId: string, extra: object = {}) => (await gw.api('POST', '/v1/pay', { body: { agentId, endpoint: `${merchant.url}/paid`, method: 'GET', ...extra } })).body

const shopperKey = await agent('shopper', { dailyBudget: { usdc: 1 } })
await agent('blocked-bot', { blockedDomains: [host] })
await agent('frugal-bot', { perCallLimit: { usdc: 0.001 } })
const first = await pay('shopper')
if (first.status !== 200) throw new Error(`the first payment failed: ${JSON.stringify(first)}`)

const b = await openBrowser(t, gw.url)
const { page } = b
const axeChecked: Record<string, unknown[]> = {}
const overflow: Record<string, string[]> = {}
async function check(name: string): Promise<void> {
  axeChecked[name] = await axeViolations(page)
  overflow[name] = await shoot(page, name)
}

t.test('serving: / redirects to /ui/, CSP allows only self, API paths are not shadowed', async (t) => {
  const res = await fetch(`${gw.url}/`, { redirect: 'manual' })
  t.equal(res.status, 302)
  t.equal(res.headers.get('location'), '/ui/')
  const ui = await fetch(`${gw.url}/ui/`)
  t.equal(ui.status, 200)
  t.match(ui.headers.get('content-type'), /^text\/html/)
  t.match(ui.headers.get('content-security-policy'), /default-src 'self'; script-src 'self'/)
  t.equal((await gw.api('GET', '/healthz')).body.status, 'ok')
  t.equal((await gw.api('GET', '/v1/transactions')).status, 200)
})

t.test('a wrong key is refused on the sign-in form and not stored', async (t) => {
  await page.goto(`${gw.url}/`)
  await page.getByLabel('API key').fill('rp_live_not-a-real-key')
  await page.getByRole('button', { name: 'Sign in' }).click()
  await page.getByRole('alert').waitFor()
  t.match(await page.getByRole('alert').textContent(), /malformed, unknown or revoked/)
  t.equal(await page.evaluate('sessionStorage.length'), 0)
  await check('signin')
})

t.test('sign in with an agent key: it sees its own agent only', async (t) => {
  t.equal(await signIn(page, gw.url, shopperKey), 'Agent key: shopper')
  t.equal(await page.evaluate('localStorage.length'), 0, 'nothing in localStorage')
  t.equal(await page.evaluate('document.cookie'), '', 'no cookie')
  await visit(page, gw.url, 'transactions', 'Transactions')
  await page.locator(`[data-tx="${first.txHash ? (await gw.api('GET', `/v1/transactions/${first.txHash}`)).body.id : ''}"]`).waitFor()
  const agents = await page.getByTestId('tx-table').locator('tbody tr td:nth-child(2)').allTextContents()
  t.ok(agents.length > 0 && agents.every((a) => a === 'shopper'), 'only its own transactions')
  await visit(page, gw.url, 'agents', 'Agents')
  await page.getByTestId('wallet').waitFor()
  t.equal(await page.getByTestId('agents-table').count(), 0, 'no agent list for an agent key')
  t.ok((await page.getByLabel('Daily budget (USDC)').getAttribute('readonly')) !== null, 'the policy is read-only')
  await page.getByRole('button', { name: 'Sign out' }).click()
  t.equal(await page.evaluate('sessionStorage.length'), 0, 'signing out forgets the key')
})

t.test('sign in with the account key: overview with every agent budget', async (t) => {
  t.equal(await signIn(page, gw.url, gw.accountKey), 'Account key')
  await page.getByTestId('budgets').getByText('shopper').waitFor()
  const meters = page.getByRole('meter')
  t.equal(await meters.count(), 3, 'a budget bar per agent')
  t.equal(await page.getByRole('meter', { name: 'shopper daily budget used' }).getAttribute('aria-valuenow'), '1', '0.01 of 1 USDC is 1%')
  await page.getByTestId('health').waitFor()
  t.match(await page.getByTestId('health').textContent(), /block \d+/)
  t.match(await page.getByTestId('protocol-split').textContent(), /x402 100%/)
  t.notOk(await page.evaluate(`location.href.includes('rp_')`), 'the key is not in the URL')
  await check('overview')
})

t.test('a paid request appears in the transactions list without a reload', async (t) => {
  await visit(page, gw.url, 'transactions', 'Transactions')
  await page.getByTestId('tx-table').waitFor()
  await page.evaluate('window.__sameDocument = true')
  const paid = await pay('shopper')
  t.equal(paid.status, 200)
  const rec = (await gw.api('GET', `/v1/transactions/${paid.txHash}`)).body
  const row = page.locator(`[data-tx="${rec.id}"]`)
  await row.waitFor()
  t.equal(await page.evaluate('window.__sameDocument'), true, 'same document: no reload')
  t.match(await row.textContent(), /shopper.*paid.*x402.*0\.01 USDC/)
  t.match(await page.getByTestId('live').textContent(), /1 new transaction/)
  await check('transactions')

  // The filters: protocol mpp finds nothing, x402 finds it.
  await page.getByLabel('Protocol').selectOption('mpp')
  await page.getByRole('button', { name: 'Apply' }).click()
  await page.getByText('No transactions match.').waitFor()
  await page.getByLabel('Protocol').selectOption('x402')
  await page.getByRole('button', { name: 'Apply' }).click()
  await row.waitFor()

  // A row opens the transaction with its ledger record.
  t.ok(await gw.gw.outbox.drain(10_000), 'ledger record confirmed')
  await row.getByRole('link').click()
  await page.getByRole('heading', { level: 1, name: 'Transaction' }).waitFor()
  await page.getByTestId('ledger').getByText('confirmed').waitFor()
  const ledger = await page.getByTestId('ledger').textContent()
  t.match(ledger, /Block\d+/)
  t.match(ledger, paid.txHash)
  await check('transaction')
})

t.test('policy events: rejections with reason, detail and endpoint, filtered by reason', async (t) => {
  const r1 = await gw.api('POST', '/v1/pay', { body: { agentId: 'blocked-bot', endpoint: `${merchant.url}/paid`, method: 'GET' } })
  t.equal(r1.body.reason, 'domain_blocked')
  const r2 = await gw.api('POST', '/v1/pay', { body: { agentId: 'frugal-bot', endpoint: `${merchant.url}/paid`, method: 'GET' } })
  t.equal(r2.body.reason, 'per_call_limit_exceeded')
  await visit(page, gw.url, 'events', 'Policy Events')
  const table = page.getByTestId('events-table')
  await table.getByText('per_call_limit_exceeded').waitFor()
  t.ok((await table.getByText('domain_blocked').count()) >= 1)
  await page.getByLabel('Reason').selectOption('per_call_limit_exceeded')
  await page.getByRole('button', { name: 'Filter' }).click()
  await page.waitForFunction(`!document.querySelector('[data-testid="events-table"]')?.textContent?.includes('domain_blocked')`)
  const reasons = await table.locator('tbody tr td:nth-child(3)').allTextContents()
  t.same([...new Set(reasons)], ['per_call_limit_exceeded'], 'only the chosen reason')
  t.match(await table.textContent(), new RegExp(`frugal-bot.*${merchant.url}/paid`))
  await check('events')
})

t.test('a cost tree opened from a leaf: totals, collapse and expand', async (t) => {
  const root = await pay('shopper')
  const child = await pay('shopper', { parentTxHash: root.txHash })
  const leaf = await pay('shopper', { parentTxHash: child.txHash })
  t.equal(leaf.status, 200)
  await visit(page, gw.url, `tree/${leaf.txHash}`, 'Cost tree')
  const tree = page.getByTestId('tree')
  await tree.waitFor()
  t.match(await page.getByRole('heading', { level: 2 }).first().textContent(), /Total 0\.03 USDC: the root and 2 payment\(s\) below it/)
  t.equal(await tree.locator('li').count(), 3, 'root, middle, leaf')
  t.match(await tree.locator('.focus-node').textContent(), /this transaction/)
  const toggle = tree.locator(`[data-node="${root.txHash}"] > .node > button`)
  t.equal(await toggle.getAttribute('aria-expanded'), 'true')
  await toggle.click()
  t.equal(await toggle.getAttribute('aria-expanded'), 'false')
  t.equal(await tree.locator('li').count(), 1, 'collapsed to the root')
  await toggle.press('Enter')
  t.equal(await tree.locator('li').count(), 3, 'expanded again from the keyboard')
  await check('tree')
})

t.test('agents: create one (key shown once), edit its policy, see the API validation error at the field', async (t) => {
  await visit(page, gw.url, 'agents', 'Agents')
  await page.getByLabel('Agent id').fill('ui-made')
  await page.getByRole('button', { name: 'Create agent' }).click()
  const shown = page.getByTestId('new-key')
  await shown.waitFor()
  const key = (await shown.locator('code').textContent()) ?? ''
  t.match(key, /^rp_/, 'the new key is shown')
  t.equal((await gw.api('GET', '/v1/me', { key })).body.agentId, 'ui-made', 'and it works')
  await page.getByTestId('agents-table').getByRole('link', { name: 'ui-made' }).click()
  await page.getByTestId('wallet').waitFor()
  t.match(await page.getByTestId('wallet').textContent(), /Balance\d/)
  await check('agents')

  await page.getByLabel('Per-call limit (USDC)').fill('0.0000001')
  await page.getByLabel('Allowed domains').fill('example.com\nhttps://bad.example/path')
  await page.getByRole('button', { name: 'Save policy' }).click()
  const err = page.locator('#p-percall-error, #p-allowed-error')
  await err.first().waitFor()
  const input = page.locator('.field.invalid :is(input, textarea)')
  t.equal(await input.getAttribute('aria-invalid'), 'true')
  t.match(await input.getAttribute('aria-describedby'), /-error/)
  const message = (await err.first().textContent()) ?? ''
  t.match(message, /perCallLimit\.usdc|allowedDomains\[1\]/, 'the API message names the field')
  t.notMatch(message, /\((perCallLimit\.usdc|allowedDomains\[1\])\)$/, 'once')
  overflow['policy-error'] = await shoot(page, 'policy-error')
  t.equal((await gw.api('GET', '/v1/policies/ui-made')).body.perCallLimit, undefined, 'nothing changed')

  await page.getByLabel('Per-call limit (USDC)').fill('0.05')
  await page.getByLabel('Allowed domains').fill('example.com')
  await page.getByRole('button', { name: 'Save policy' }).click()
  await page.getByText('Policy saved.').waitFor()
  t.same((await gw.api('GET', '/v1/policies/ui-made')).body.perCallLimit, { usdc: 0.05 })
  t.same((await gw.api('GET', '/v1/policies/ui-made')).body.allowedDomains, ['example.com'])
})

t.test('settings: CA download, chain info; missing features read as not available', async (t) => {
  await visit(page, gw.url, 'settings', 'Settings')
  await page.getByTestId('chain').waitFor()
  t.match(await page.getByTestId('chain').textContent(), /chain id 84532/)
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByTestId('ca-download').click()])
  const pem = readFileSync((await download.path())!, 'utf8')
  t.equal(pem, gw.gw.ca.certPem, 'the downloaded file is the CA certificate')
  t.equal(download.suggestedFilename(), 'paygate-ca.pem')
  await check('settings')
})

t.test('pages of features this gateway lacks say so instead of failing', async (t) => {
  for (const [route, heading] of [
    ['alerts', 'Alerts'],
    ['deliveries', 'Deliveries'],
  ] as const) {
    await visit(page, gw.url, route, heading)
    const probe = await gw.api('GET', `/v1/${route}`)
    if (probe.status === 404) await page.getByTestId('unavailable').waitFor()
    else await page.getByRole('table').or(page.getByText(/^No /)).first().waitFor()
    await check(route)
  }
  await visit(page, gw.url, 'runs', 'Runs')
  await page.getByLabel('Orchestrator agent').fill('shopper')
  await page.getByRole('button', { name: 'Show runs' }).click()
  if ((await gw.api('GET', '/v1/runs?agentId=shopper')).status === 404) await page.getByTestId('unavailable').waitFor()
  else
    await page
      .getByRole('table')
      .or(page.getByText(/^No runs/))
      .first()
      .waitFor()
  await check('runs')
  t.pass('each page rendered')
})

t.test('keyboard: the navigation is reachable by Tab and marks the current page', async (t) => {
  await visit(page, gw.url, 'overview', 'Overview')
  await page.reload()
  await page.getByRole('heading', { level: 1, name: 'Overview' }).waitFor()
  await page.keyboard.press('Tab')
  t.equal(await page.evaluate('document.activeElement?.textContent'), 'Skip to content')
  await page.keyboard.press('Tab')
  t.equal(await page.evaluate('document.activeElement?.textContent'), 'Overview')
  t.equal(await page.evaluate(`document.activeElement?.getAttribute('aria-current')`), 'page')
  await page.keyboard.press('Tab')
  await page.keyboard.press('Enter')
  await page.getByRole('heading', { level: 1, name: 'Transactions' }).waitFor()
})

t.test('axe: no serious or critical violation on any page', async (t) => {
  t.ok(Object.keys(axeChecked).length >= 9, `pages checked: ${Object.keys(axeChecked).join(', ')}`)
  for (const [name, v] of Object.entries(axeChecked)) t.same(v, [], `${name}: no serious violation`)
})

t.test('no page scrolls sideways at 1280 or 390 px', async (t) => {
  for (const [name, o] of Object.entries(overflow)) t.same(o, [], name)
})

t.test('no request left loopback, no CSP violation, no page error', async (t) => {
  t.ok(b.requests.length > 20, `${b.requests.length} requests seen`)
  const origin = new URL(gw.url)
  t.same(
    b.requests.filter((u) => new URL(u).host !== origin.host),
    [],
    'every request went to the gateway',
  )
  t.equal(origin.hostname, '127.0.0.1', 'which is on loopback')
  t.same(b.blocked, [])
  t.same(b.problems, [], 'no console error, CSP violation or page error')
})
