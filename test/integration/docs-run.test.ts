import t from 'tap'
import { execFile } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { startDemoMerchant } from '../../src/demo/merchant.js'
import { startTestGateway } from '../helpers/gateway.js'
import { runnableBlocks } from '../helpers/runnable.js'

/**
 * Docs that run: every `<!-- runnable -->` sh block of the README and docs/*.md runs as
 * written, in order, one sh per document (variables carry from block to block), against a
 * live gateway and the demo merchant. The blocks get only the variables the docs define
 * (docs/docs-that-run.md): API, PROXY, PAYGATE_KEY, MERCHANT.
 */
const ROOT = fileURLToPath(new URL('../..', import.meta.url))
const gw = await startTestGateway()
t.teardown(() => gw.close())
const chain = (await gw.api('GET', '/v1/chain')).body
const merchant = await startDemoMerchant({ rpcUrl: chain.rpcUrl, chainId: chain.chainId, network: chain.network, token: chain.token })
t.teardown(() => merchant.close())
const env = { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', API: gw.url, PROXY: gw.gw.proxyUrl, PAYGATE_KEY: gw.accountKey, MERCHANT: merchant.url }

const documents = [
  'README.md',
  ...readdirSync(`${ROOT}/docs`)
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
]
const withBlocks = documents.map((file) => ({ file, blocks: runnableBlocks(readFileSync(`${ROOT}/${file}`, 'utf8')) })).filter((d) => d.blocks.length)

t.ok(withBlocks.length > 0, 'some document has runnable blocks')

const END = (i: number): string => `@@paygate-doc-block-${i}-done@@`

for (const { file, blocks } of withBlocks) {
  t.test(`${file}: ${blocks.length} runnable block(s)`, async (t) => {
    const script = ['set -e', ...blocks.flatMap((b, i) => [b.code, `echo; echo '${END(i)}'`])].join('\n')
    const { code, stdout, stderr } = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      execFile('sh', ['-c', script], { cwd: ROOT, env, timeout: 180_000, maxBuffer: 8 << 20 }, (e, stdout, stderr) =>
        resolve({ code: e ? Number((e as { code?: number }).code ?? 1) : 0, stdout, stderr }),
      )
    })
    let rest = stdout
    for (const [i, b] of blocks.entries()) {
      const at = rest.indexOf(END(i))
      if (at < 0) {
        t.fail(`${file}:${b.line} failed (exit ${code})`, { stdout: rest, stderr })
        return
      }
      const output = rest.slice(0, at)
      rest = rest.slice(at + END(i).length)
      t.pass(`${file}:${b.line} ran`)
      if (b.expect) t.match(output, b.expect, `${file}:${b.line} output matches ${b.expect}`)
    }
    t.equal(code, 0)
  })
}
