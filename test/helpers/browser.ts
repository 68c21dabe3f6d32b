import type { Test } from 'tap'
import { spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core'
import { startTestGateway, testChain, type TestGateway } from './gateway.js'
import { type Merchant, startV2Merchant } from './merchants.js'

const root = fileURLToPath(new URL('../..', import.meta.url))
export const SCREENSHOTS = join(root, 'test-output', 'screenshots')
/** Debian's Chromium (`.ci/run` installs it with apt); PAYGATE_CHROMIUM overrides. */
export const CHROMIUM = process.env.PAYGATE_CHROMIUM ?? '/usr/bin/chromium'
export const WIDTHS = { desktop: 1280, phone: 390 } as const

/** Build the dashboard if its sources changed since the last build (incremental: usually a no-op). */
export function buildDashboard(): void {
  const r = spawnSync(process.execPath, [join(root, 'scripts', 'build-web.mjs')], { cwd: root, encoding: 'utf8' })
  if (r.status !== 0) throw new Error(`dashboard build failed: ${r.stderr || r.stdout}`)
}

/**
 * The dashboard built, and a gateway (chain id 84532, as x402's v1 packages name it) with a
 * real x402 v2 merchant selling at 0.01 USDC on its embedded chain; both closed at the end of `t`.
 */
export async function dashboardGateway(t: Test): Promise<{ gw: TestGateway; merchant: Merchant }> {
  buildDashboard()
  const gw = await startTestGateway({ env: { PAYGATE_CHAIN_CHAIN_ID: '84532' } })
  t.teardown(() => gw.close())
  const { merchantOptions } = await testChain(gw)
  const merchant = await startV2Merchant(await merchantOptions(10_000n))
  t.teardown(() => merchant.close())
  return { gw, merchant }
}

const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8')

export interface Browsing {
  browser: Browser
  context: BrowserContext
  page: Page
  /** Every URL the page asked for (the test checks they all stay on the gateway's loopback origin). */
  requests: string[]
  /** Requests refused because they were not for the gateway. */
  blocked: string[]
  /** Console errors and CSP violations reported by the page. */
  problems: string[]
}

/** Headless Chromium (`--no-sandbox`: CI runs as root) whose pages may reach only `origin`. */
export async function openBrowser(t: Test, origin: string): Promise<Browsing> {
  if (!existsSync(CHROMIUM)) throw new Error(`Chromium not found at ${CHROMIUM}: apt-get install -y chromium (.ci/run does)`)
  mkdirSync(SCREENSHOTS, { recursive: true })
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--disable-default-apps', '--no-first-run', '--disable-sync'],
  })
  t.teardown(() => browser.close())
  const context = await browser.newContext({ viewport: { width: WIDTHS.desktop, height: 900 }, acceptDownloads: true, serviceWorkers: 'block' })
  const requests: string[] = []
  const blocked: string[] = []
  const problems: string[] = []
  await context.route('**/*', (route) => {
    const url = route.request().url()
    requests.push(url)
    if (url.startsWith(`${origin}/`) || url === origin) return route.continue()
    blocked.push(url)
    return route.abort('blockedbyclient')
  })
  // HTTP error statuses are logged by Chromium as "Failed to load resource"; the tests provoke
  // some on purpose (a wrong key, an invalid policy). Everything else is a problem.
  await context.addInitScript(`document.addEventListener('securitypolicyviolation', (e) => console.error('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI))`)
  const page = await context.newPage()
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) problems.push(m.text())
  })
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`))
  return { browser, context, page, requests, blocked, problems }
}

/** axe-core's serious and critical violations on the current page (evaluated outside the page's CSP). */
export async function axeViolations(page: Page): Promise<{ id: string; impact: string; nodes: string[] }[]> {
  await page.evaluate(`${axeSource}\n;undefined`)
  const result = (await page.evaluate(`axe.run(document, { resultTypes: ['violations'] })`)) as {
    violations: { id: string; impact: string; nodes: { target: string[] }[] }[]
  }
  return result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical').map((v) => ({ id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' ')) }))
}

/** Sign in through the form with `key`; resolves when the dashboard shows who is signed in. */
export async function signIn(page: Page, url: string, key: string): Promise<string> {
  await page.goto(`${url}/`)
  await page.getByLabel('API key').fill(key)
  await page.getByRole('button', { name: 'Sign in' }).click()
  return (await page.getByTestId('who').textContent()) ?? ''
}

/** Open a hash route and wait for its heading. */
export async function visit(page: Page, url: string, route: string, heading: string | RegExp): Promise<void> {
  await page.goto(`${url}/ui/#/${route}`)
  await page.getByRole('heading', { level: 1, name: heading }).waitFor()
}

/**
 * Screenshots of the current route at both widths, named `<name>-desktop.png` / `<name>-phone.png`.
 * Returns the widths at which the page scrolled sideways (content wider than the window).
 */
export async function shoot(page: Page, name: string, settle: () => Promise<void> = async () => {}): Promise<string[]> {
  const overflowed: string[] = []
  for (const [label, width] of Object.entries(WIDTHS)) {
    await page.setViewportSize({ width, height: 900 })
    await settle()
    // Two frames: layout and resize observers run after the viewport change.
    await page.evaluate('new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))')
    const scrollWidth = (await page.evaluate('document.documentElement.scrollWidth')) as number
    if (scrollWidth > width) overflowed.push(`${label}: ${scrollWidth}px in ${width}px`)
    await page.screenshot({ path: join(SCREENSHOTS, `${name}-${label}.png`), fullPage: true })
  }
  await page.setViewportSize({ width: WIDTHS.desktop, height: 900 })
  return overflowed
}
