/**
 * The CPU a body-less upstream request costs Paygate's process on each of its two HTTP clients
 * (issue 28): undici, as `POST /v1/pay` sends (`Upstream.send`, its body read with `readBody`),
 * and the proxy's own keep-alive connections (`OriginPool`, the body gathered into one buffer).
 * A target in a child process answers every GET with a 402 and a 600-byte header, as a merchant
 * does; the requests carry a 400-byte payment header. Sequential requests in alternating
 * rounds; prints this process's CPU and the wall time per request:
 *
 *   npx tsx scripts/upstream-clients.ts [--requests 10000] [--rounds 3]
 *
 * Loopback only; bounded by requests x rounds. Only the target this script starts is killed, by its pid.
 */
import { spawn } from 'node:child_process'
import { createLogger } from '../src/log/index.js'
import { EgressGuard } from '../src/net/egress.js'
import { type ExchangeSink, OriginPool } from '../src/upstream/origins.js'
import { readBody, Upstream } from '../src/upstream/upstream.js'

const argv = process.argv.slice(2)
const opt = (name: string, dflt: number): number => {
  const i = argv.indexOf(`--${name}`)
  return i >= 0 ? Number(argv[i + 1]) : dflt
}
const REQUESTS = opt('requests', 10_000)
const ROUNDS = opt('rounds', 3)

const TARGET = `const s = require('node:http').createServer((req, res) => { res.writeHead(402, { 'payment-required': 'x'.repeat(600), 'content-type': 'application/json' }); res.end('{}') });
s.keepAliveTimeout = 60000; s.listen(0, '127.0.0.1', () => process.stdout.write(JSON.stringify({ port: s.address().port }) + '\\n'))`
const target = spawn(process.execPath, ['-e', TARGET], { stdio: ['ignore', 'pipe', 'inherit'] })
process.on('exit', () => {
  try {
    process.kill(target.pid!)
  } catch {}
})
const port: number = await new Promise((resolve) => target.stdout!.once('data', (d) => resolve((JSON.parse(String(d)) as { port: number }).port)))

const egress = new EgressGuard({ allow: ['127.0.0.0/8'], deny: [], log: createLogger('silent') })
const upstream = new Upstream(null, egress, 30_000)
const pool = new OriginPool(undefined, egress, 30_000)
const headers: Record<string, string> = { accept: 'application/json', 'user-agent': 'paygate-bench', 'payment-signature': 'y'.repeat(400) }

async function viaUndici(): Promise<void> {
  const r = await upstream.send({ url: `http://127.0.0.1:${port}/paid`, method: 'GET', headers, body: null })
  await readBody(r.body, 64 * 1024)
}

function viaOriginPool(): Promise<void> {
  let head = `GET /paid HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\n`
  for (const k in headers) head += `${k}: ${headers[k]}\r\n`
  head += '\r\n'
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    const sink: ExchangeSink = {
      head: (h, framing) => {
        if (!h || !framing) reject(new Error('the target answered what the pool leaves alone'))
        return true
      },
      data: (chunk, transient) => {
        chunks.push(transient ? Buffer.from(chunk) : chunk)
        return true
      },
      end: () => {
        Buffer.concat(chunks)
        resolve()
      },
      flush: () => {},
      error: (e) => reject(e),
    }
    pool.request({ https: false, host: '127.0.0.1', port }, head, 'GET', sink)
  })
}

for (let round = 0; round < ROUNDS; round++) {
  for (const [name, send] of [
    ['undici', viaUndici],
    ['origin pool', viaOriginPool],
  ] as const) {
    for (let i = 0; i < 500; i++) await send() // warm-up
    const cpu = process.cpuUsage()
    const wall = performance.now()
    for (let i = 0; i < REQUESTS; i++) await send()
    const used = process.cpuUsage(cpu)
    const us = (x: number): string => (x / REQUESTS).toFixed(1)
    console.log(`round ${round + 1} ${name.padEnd(11)} CPU ${us(used.user + used.system)} us/request, wall ${us((performance.now() - wall) * 1000)} us/request`)
  }
}
await upstream.close()
pool.close()
process.exit(0)
