import t from 'tap'
import { createServer, type IncomingMessage } from 'node:http'
import type { AddressInfo } from 'node:net'
import { axeViolations, dashboardGateway, openBrowser, shoot, signIn, visit } from '../helpers/browser.js'

/**
 * The dashboard pages whose API comes from other features: alerts, deliveries and the
 * webhook secret (issue 24), runs (issue 22), spend metrics (issue 23). Each test asks the
 * gateway for its route first and skips, naming the route, while that answers 404: a skip
 * here is a feature not merged yet, not a pass.
 */
const { gw, merchant } = await dashboardGateway(t)
await gw.api('POST', '/v1/agents', { body: { agentId: 'shopper' } })
await gw.api('POST', '/v1/wallets', { body: { agentId: 'shopper' } })
await gw.api('POST', '/v1/pay', { body: { agentId: 'shopper', endpoint: `${merchant.url}/paid`, method: 'GET' } })

/** A loopback receiver for webhooks and a sub-agent: records every request body. */
const received: { path: string; body: string; headers: IncomingMessage['headers'] }[] = []
const receiver = createServer((req, res) => {
  let body = ''
  req.on('data', (c) => (body += c))
  req.on('end', () => {
    received.push({ path: req.url ?? '', body, headers: req.headers })
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ output: 'done' }))
  })
})
await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r))
t.teardown(() => new Promise<void>((r) => receiver.close(() => r())))
const receiverUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`

const b = await openBrowser(t, gw.url)
const { page } = b
await signIn(page, gw.url, gw.accountKey)

/** The reason to skip when `path` is not on this gateway, else false. */
async function missing(path: string, issue: string): Promise<string | false> {
  const r = await gw.api('GET', path)
  return r.status === 404 && /no such endpoint/.test(r.body?.detail ?? '') ? `GET ${path} answers 404 on this gateway (${issue} not merged)` : false
}

// Every probe before the first subtest: tap ends the file once its queue is empty.
const skip = {
  alerts: await missing('/v1/alerts', 'issue 24'),
  deliveries: await missing('/v1/deliveries', 'issue 24'),
  secret: await missing('/v1/settings/webhooks', 'issue 24'),
  runs: await missing('/v1/runs?agentId=shopper', 'issue 22'),
  metrics: await missing('/v1/metrics', 'issue 23'),
}

t.test('alerts: create, test (the receiver gets alert.test), delete', { skip: skip.alerts }, async (t) => {
  await visit(page, gw.url, 'alerts', 'Alerts')
  await page.getByLabel('Agent').fill('shopper')
  await page.getByLabel('Type').selectOption('policy_violation')
  await page.getByLabel('Channel').selectOption('webhook')
  await page.getByLabel('URL').fill(`${receiverUrl}/hook`)
  await page.getByRole('button', { name: 'Create alert' }).click()
  const table = page.getByTestId('alerts-table')
  await table.getByText('policy_violation').waitFor()
  t.equal((await gw.api('GET', '/v1/alerts?agentId=shopper')).body.alerts.length, 1)
  await table.getByRole('button', { name: 'Test' }).click()
  await page.getByText(/Test event sent/).waitFor()
  for (let i = 0; i < 200 && !received.some((r) => r.path === '/hook'); i++) await new Promise((r) => setTimeout(r, 50))
  const hook = received.find((r) => r.path === '/hook')
  t.ok(hook, 'the receiver got the test event')
  t.equal(JSON.parse(hook?.body ?? '{}').event, 'alert.test')
  t.match(hook?.headers['x-service-signature'], /^sha256=[0-9a-f]{64}$/)
  t.same(await axeViolations(page), [])
  t.same(await shoot(page, 'alerts-live'), [], 'no sideways scrolling')
  await table.getByRole('button', { name: 'Delete' }).click()
  await page.getByText('No alerts yet.').waitFor()
  t.equal((await gw.api('GET', '/v1/alerts?agentId=shopper')).body.alerts.length, 0)
})

t.test('alerts: the API validation message is shown at the field', { skip: skip.alerts }, async (t) => {
  await visit(page, gw.url, 'alerts', 'Alerts')
  await page.getByLabel('Agent').fill('shopper')
  await page.getByLabel('Type').selectOption('budget_pct')
  await page.getByLabel(/Threshold/).fill('250')
  await page.getByLabel('URL').fill(`${receiverUrl}/hook`)
  await page.getByRole('button', { name: 'Create alert' }).click()
  await page.locator('#a-threshold-error').waitFor()
  t.equal(await page.getByLabel(/Threshold/).getAttribute('aria-invalid'), 'true')
})

t.test('deliveries: the log lists the test delivery', { skip: skip.deliveries }, async (t) => {
  await visit(page, gw.url, 'deliveries', 'Deliveries')
  const table = page.getByTestId('deliveries-table')
  await table.getByText('alert.test').first().waitFor()
  t.ok((await table.locator('tbody tr').count()) >= 1)
  t.same(await axeViolations(page), [])
  t.same(await shoot(page, 'deliveries-live'), [], 'no sideways scrolling')
})

t.test('settings: reveal and rotate the webhook secret', { skip: skip.secret }, async (t) => {
  await visit(page, gw.url, 'settings', 'Settings')
  await page.getByRole('button', { name: 'Reveal secret' }).click()
  const shown = page.getByTestId('webhook-secret')
  await shown.waitFor()
  const before = (await shown.textContent()) ?? ''
  t.equal(before, (await gw.api('GET', '/v1/settings/webhooks')).body.secret)
  await page.getByRole('button', { name: 'Rotate secret' }).click()
  await page.getByText(/Rotated/).waitFor()
  const after = (await shown.textContent()) ?? ''
  t.not(after, before, 'a new secret')
  t.equal(after, (await gw.api('GET', '/v1/settings/webhooks')).body.secret, 'and it is the one in force')
  t.same(await shoot(page, 'settings-secret'), [], 'no sideways scrolling')
})

t.test('runs: a run with its total cost', { skip: skip.runs }, async (t) => {
  const r = await gw.api('POST', '/v1/agents/invoke', {
    headers: { 'x-agent-id': 'shopper' },
    body: { agentEndpoint: `${receiverUrl}/agent`, task: { q: 'hi' }, budget: { usdc: 0.5 }, runId: 'run-ui-1' },
  })
  t.equal(r.status, 200, r.text)
  await visit(page, gw.url, 'runs', 'Runs')
  await page.getByLabel('Orchestrator agent').fill('shopper')
  await page.getByRole('button', { name: 'Show runs' }).click()
  await page.getByTestId('runs-table').getByRole('link', { name: 'run-ui-1' }).click()
  await page.getByRole('heading', { level: 1, name: 'Run run-ui-1' }).waitFor()
  t.match(await page.getByRole('heading', { level: 2 }).first().textContent(), /Total 0 USDC/)
  t.same(await axeViolations(page), [])
  t.same(await shoot(page, 'runs-live'), [], 'no sideways scrolling')
})

t.test('overview: spend over time from the metrics API', { skip: skip.metrics }, async (t) => {
  await visit(page, gw.url, 'overview', 'Overview')
  await page.locator('.chart canvas').waitFor()
  t.match(await page.getByTestId('protocol-split').textContent(), /x402 100%/)
  t.match(await page.locator('#spend-h + p, #spend-h ~ p').first().textContent(), /0\.01 USDC in 1 payment/)
  t.same(await axeViolations(page), [])
  t.same(await shoot(page, 'overview-metrics'), [], 'no sideways scrolling')
})

t.test('every request stayed on the gateway, no page error', async (t) => {
  t.same(
    b.requests.filter((u) => new URL(u).host !== new URL(gw.url).host),
    [],
  )
  t.same(b.problems, [])
})
