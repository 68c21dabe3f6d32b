import t, { type Test } from 'tap'
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { brotliCompressSync, deflateRawSync, deflateSync, gzipSync } from 'node:zlib'
import { startTestGateway, testChain } from '../helpers/gateway.js'
import { startV2Merchant, type Merchant } from '../helpers/merchants.js'

/**
 * POST /v1/pay at its edges: header values undici would refuse, errors an idempotency key
 * must not keep (nothing was paid), and a paid answer whose body cannot be read.
 */
const gw = await startTestGateway({ env: { PAYGATE_CHAIN_CHAIN_ID: '84532' } })
t.teardown(() => gw.close())
const { merchantOptions } = await testChain(gw)
await gw.api('POST', '/v1/agents', { body: { agentId: 'edge' } })
await gw.api('POST', '/v1/wallets', { body: { agentId: 'edge' } })

const PRICE = 10_000n
const OVER = 11 * 1024 * 1024
const pay = (body: Record<string, unknown>) => gw.api('POST', '/v1/pay', { body: { agentId: 'edge', ...body } })

async function serve(handler: (req: IncomingMessage, res: ServerResponse) => void, port = 0): Promise<{ server: Server; url: string; close(): Promise<void> }> {
  const server = createServer(handler)
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', r))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  return {
    server,
    url,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections()
        server.close(() => r())
      }),
  }
}

/** Headers, then part of the promised body, then the connection is cut. */
function cutOff(res: ServerResponse, headers: Record<string, string> = {}): void {
  res.writeHead(200, { ...headers, 'content-type': 'application/json', 'content-length': '100000' })
  res.write('{"partial":"')
  setTimeout(() => res.socket?.destroy(), 50)
}

function tooLarge(res: ServerResponse, headers: Record<string, string> = {}): void {
  res.writeHead(200, { ...headers, 'content-type': 'text/plain', 'content-length': String(OVER) })
  res.end(Buffer.alloc(OVER, 'a'))
}

t.test('header values undici would refuse are 400 naming the header; Latin-1 and inner tabs go through', async (t) => {
  const seen: string[][] = []
  const target = await serve((req, res) => {
    seen.push(req.rawHeaders)
    res.end('{"ok":true}')
  })
  t.teardown(() => target.close())
  const cases: [Record<string, string>, string, RegExp][] = [
    [{ 'X-A': 'a\u0000b' }, 'headers.X-A', /U\+0000 at index 1/],
    [{ 'x-snow': 'snow \u2603' }, 'headers.x-snow', /U\+2603/],
    [{ 'x-del': 'x\u007fy' }, 'headers.x-del', /U\+007F/],
    [{ 'x-nl': 'a\r\nb: c' }, 'headers.x-nl', /U\+000D/],
    [{ Expect: '100-continue' }, 'headers.Expect', /cannot be sent/],
  ]
  for (const [headers, field, detail] of cases) {
    const r = await pay({ endpoint: `${target.url}/h`, headers })
    t.same([r.status, r.body.error, r.body.field], [400, 'invalid_request', field], field)
    t.match(r.body.detail, detail)
  }
  t.equal(seen.length, 0, 'none of them reached the target')

  const ok = await pay({ endpoint: `${target.url}/h`, headers: { 'x-latin': 'caf\u00e9 \u00ff', 'x-tab': 'a\tb c', Connection: 'keep-alive' } })
  t.equal(ok.status, 200, ok.text)
  const raw = seen[0]!
  const value = (name: string) => raw[raw.findIndex((h, i) => i % 2 === 0 && h.toLowerCase() === name) + 1]
  t.equal(value('x-latin'), 'caf\u00e9 \u00ff', 'obs-text is sent as its Latin-1 bytes')
  t.equal(value('x-tab'), 'a\tb c')
})

t.test('a target down, then up: the same idempotencyKey runs again and succeeds', async (t) => {
  const probe = await serve(() => {})
  const port = (probe.server.address() as AddressInfo).port
  await probe.close()
  const body = { endpoint: `http://127.0.0.1:${port}/report`, idempotencyKey: 'down-then-up' }
  const down = await pay(body)
  t.same([down.status, down.body.error], [502, 'upstream_unreachable'], down.text)

  const up = await serve((_req, res) => res.end('{"ok":"up"}'), port)
  t.teardown(() => up.close())
  const again = await pay(body)
  t.equal(again.status, 200, again.text)
  t.same(again.body.data, { ok: 'up' })
  t.same((await pay(body)).body, again.body, 'the success is what is kept')
})

t.test('an unreadable 402, then a readable answer: the same idempotencyKey runs again', async (t) => {
  let calls = 0
  const target = await serve((_req, res) => {
    if (calls++ === 0) {
      res.writeHead(402, { 'content-type': 'text/plain' })
      res.end('pay me somehow')
      return
    }
    res.end('{"ok":"fixed"}')
  })
  t.teardown(() => target.close())
  const body = { endpoint: `${target.url}/x`, idempotencyKey: 'unreadable-402' }
  const first = await pay(body)
  t.same([first.status, first.body.error], [502, 'payment_protocol_error'])
  const second = await pay(body)
  t.equal(second.status, 200, second.text)
  t.same(second.body.data, { ok: 'fixed' })
})

t.test('an unpaid answer that is too large or cut off is an error naming it, not payment_failed, and is not kept', async (t) => {
  let calls = 0
  const target = await serve((req, res) => {
    calls++
    if (req.url === '/big') tooLarge(res)
    else cutOff(res)
  })
  t.teardown(() => target.close())
  const big = await pay({ endpoint: `${target.url}/big`, idempotencyKey: 'big-free' })
  t.same([big.status, big.body.error, big.body.reason], [502, 'upstream_unreachable', 'upstream_body_too_large'], big.text)
  t.match(big.body.detail, /exceeds 10485760 bytes/)
  const cut = await pay({ endpoint: `${target.url}/cut` })
  t.same([cut.status, cut.body.error, cut.body.reason], [502, 'upstream_unreachable', 'upstream_body_lost'], cut.text)
  t.match(cut.body.detail, /broke off before its end: \S/, 'the read error is kept')
  const before = calls
  await pay({ endpoint: `${target.url}/big`, idempotencyKey: 'big-free' })
  t.equal(calls, before + 1, 'the same key asks the target again (nothing was paid)')
})

/**
 * A loopback front for the official v2 merchant: requests pass through with their Host, so
 * the merchant's offer names the front's origin; the paid answer (it carries PAYMENT-RESPONSE)
 * is replaced by `spoil`, after the merchant has settled.
 */
async function spoiledMerchant(t: Test, spoil: (res: ServerResponse, headers: Record<string, string>) => void): Promise<{ url: string; m: Merchant }> {
  const m = await startV2Merchant(await merchantOptions(PRICE))
  t.teardown(() => m.close())
  const front = await serve((req, res) => {
    const up = httpRequest(m.url + req.url, { method: req.method, headers: req.headers }, (answer) => {
      const settled = answer.headers['payment-response']
      if (answer.statusCode === 200 && typeof settled === 'string') {
        answer.resume()
        spoil(res, { 'payment-response': settled })
        return
      }
      res.writeHead(answer.statusCode!, answer.headers)
      answer.pipe(res)
    })
    up.on('error', () => res.destroy())
    req.pipe(up)
  })
  t.teardown(() => front.close())
  return { url: front.url, m }
}

const spoils: [string, (res: ServerResponse, headers: Record<string, string>) => void, string, RegExp][] = [
  ['over the size limit', tooLarge, 'upstream_body_too_large', /exceeds 10485760 bytes/],
  ['cut off mid-body', cutOff, 'upstream_body_lost', /broke off before its end: \S/],
]
for (const [what, spoil, reason, detail] of spoils) {
  t.test(`a paid answer ${what}: 200 with txHash, data null and the reason; a replay returns the same`, async (t) => {
    const { url, m } = await spoiledMerchant(t, spoil)
    const body = { endpoint: `${url}/paid`, idempotencyKey: `spoiled-${reason}` }
    const r = await pay(body)
    t.equal(r.status, 200, r.text)
    t.equal(r.body.protocol, 'x402')
    t.same(r.body.amountPaid, { usdc: 0.01 })
    t.match(r.body.txHash, /^0x[0-9a-f]{64}$/)
    t.equal(r.body.status, 200)
    t.equal(r.body.data, null)
    t.equal(r.body.dataError.error, reason)
    t.match(r.body.dataError.detail, detail)
    t.match(r.body.transactionId, /^tx_/)
    t.match(r.body.settlement, { success: true, transaction: m.stats.transactions[0] }, "the merchant's settlement header is read")
    t.equal(m.stats.settlements, 1)
    t.equal((await gw.api('GET', `/v1/transactions/${r.body.txHash}`)).body.status, 'paid')

    const replay = await pay(body)
    t.same([replay.status, replay.body], [200, r.body], 'the idempotent replay answers the same')
    t.equal(m.stats.settlements, 1, 'and pays nothing more')
    t.equal(m.stats.paidAttempts, 1)
  })
}

t.test("a compressed answer is decoded into data; the caller's Accept-Encoding is not passed on", async (t) => {
  const asked: (string | undefined)[] = []
  const target = await serve((req, res) => {
    asked.push(req.headers['accept-encoding'])
    const coding = req.url!.slice(1)
    const json = Buffer.from(JSON.stringify({ hello: 'world', coding }))
    const body =
      coding === 'gzip'
        ? gzipSync(json)
        : coding === 'br'
          ? brotliCompressSync(json)
          : coding === 'deflate'
            ? deflateSync(json)
            : coding === 'raw-deflate'
              ? deflateRawSync(json)
              : Buffer.from('not gzip at all')
    const header = coding === 'broken' ? 'gzip' : coding === 'raw-deflate' ? 'deflate' : coding
    res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': header })
    res.end(body)
  })
  t.teardown(() => target.close())
  for (const coding of ['gzip', 'br', 'deflate', 'raw-deflate']) {
    const r = await pay({ endpoint: `${target.url}/${coding}`, headers: { 'accept-encoding': 'gzip, br' } })
    t.equal(r.status, 200, r.text)
    t.same(r.body.data, { hello: 'world', coding }, `${coding} decoded`)
  }
  t.same(asked, [undefined, undefined, undefined, undefined], 'the target was not asked for a coding')
  const broken = await pay({ endpoint: `${target.url}/broken` })
  t.same([broken.status, broken.body.error, broken.body.reason], [502, 'upstream_unreachable', 'upstream_body_lost'], 'an answer that does not decode is not passed off as data')
})
