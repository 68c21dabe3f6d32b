import t from 'tap'
import type { ContextBlock, HeaderBlock, KnownBlock, SectionBlock } from '@slack/types'
import { simpleParser } from 'mailparser'
import { SMTPServer } from 'smtp-server'
import { startTestGateway } from '../helpers/gateway.js'
import { listenForTest } from '../helpers/listen.js'
import { startReceiver } from '../helpers/receiver.js'

/**
 * The e-mail channel against a real SMTP server on loopback (smtp-server, the message parsed
 * with mailparser), and the Slack channel's body checked against Block Kit's types.
 */
const mails: { from: string; to: string[]; raw: Buffer }[] = []
const smtp = new SMTPServer({
  authOptional: true,
  disabledCommands: ['STARTTLS'],
  logger: false,
  onRcptTo(address, _session, cb) {
    if (address.address.startsWith('bounce@')) return cb(Object.assign(new Error('mailbox unavailable'), { responseCode: 550 }))
    cb()
  },
  onData(stream, session, cb) {
    const chunks: Buffer[] = []
    stream.on('data', (c: Buffer) => chunks.push(c))
    stream.on('end', () => {
      mails.push({ from: session.envelope.mailFrom ? session.envelope.mailFrom.address : '', to: session.envelope.rcptTo.map((r) => r.address), raw: Buffer.concat(chunks) })
      cb()
    })
  },
})
const smtpPort = await listenForTest(t, smtp.server)

const gw = await startTestGateway({ env: { PAYGATE_SMTP_URL: `smtp://127.0.0.1:${smtpPort}`, PAYGATE_SMTP_FROM: 'Paygate <alerts@paygate.test>' } })
t.teardown(() => gw.close())
await gw.api('POST', '/v1/agents', { body: { agentId: 'ch' } })

t.test('email: delivered to the SMTP server (250), a designed subject with text and HTML bodies', async (t) => {
  const r = await gw.api('POST', '/v1/alerts', { body: { agentId: 'ch', type: 'budget_pct', threshold: 80, notify: { type: 'email', address: 'ops@example.com' } } })
  t.equal(r.status, 201, r.text)
  t.same(r.body.notify, { type: 'email', address: 'ops@example.com' })
  t.equal((await gw.api('POST', '/v1/alerts', { body: { agentId: 'ch', type: 'policy_violation', notify: { type: 'email', address: 'not an address' } } })).body.field, 'notify.address')
  const sent = await gw.api('POST', `/v1/alerts/${r.body.alertId}/test`)
  t.equal(sent.status, 202)
  await gw.gw.notify.settle()
  t.equal(mails.length, 1)
  const mail = await simpleParser(mails[0]!.raw)
  t.same(mails[0]!.to, ['ops@example.com'])
  t.equal(mails[0]!.from, 'alerts@paygate.test')
  t.equal(mail.subject, '[Paygate] Test notification for agent ch')
  t.match(mail.text, /Alert al_\w+ \(budget_pct\) reaches this channel\./)
  t.match(mail.text, /"event": "alert\.test"/, 'the JSON payload is in the text body')
  t.match(String(mail.html), /<h2>Test notification for agent ch<\/h2>/)
  t.equal(mail.headers.get('x-paygate-delivery'), sent.body.deliveryId)
  const [d] = (await gw.api('GET', `/v1/deliveries?alertId=${r.body.alertId}`)).body.deliveries
  t.match(d, { status: 'delivered', channel: { type: 'email' }, attempts: [{ status: 250, error: null }] })
})

t.test('slack: a Block Kit message (header, fields, context) with a top-level text fallback', async (t) => {
  const rx = await startReceiver(t)
  const url = `${rx.url}/services/T0001/B0002/abcdefghijklmnopqrstuvwx`
  const r = await gw.api('POST', '/v1/alerts', { body: { agentId: 'ch', type: 'spend_rate', threshold: 5, window: '1h', notify: { type: 'slack', url } } })
  t.equal(r.status, 201)
  t.notMatch(JSON.stringify(r.body), /abcdefghij/, 'the token-carrying URL is masked')
  await gw.api('POST', `/v1/alerts/${r.body.alertId}/test`)
  await gw.gw.notify.settle()
  t.equal(rx.got.length, 1)
  const msg = rx.got[0]!.body as { text: string; blocks: KnownBlock[] }
  t.equal(typeof msg.text, 'string')
  t.match(msg.text, /^Test notification for agent ch: /)
  t.same(
    msg.blocks.map((b) => b.type),
    ['header', 'section', 'context'],
  )
  // Block Kit's limits, on the types @slack/types gives them.
  const header = msg.blocks[0] as HeaderBlock
  t.equal(header.text.type, 'plain_text')
  t.ok(header.text.text.length > 0 && header.text.text.length <= 150)
  const section = msg.blocks[1] as SectionBlock
  t.ok(section.fields && section.fields.length > 0 && section.fields.length <= 10)
  for (const f of section.fields!) t.ok(f.type === 'mrkdwn' && f.text.length <= 2000)
  const context = msg.blocks[2] as ContextBlock
  t.ok(context.elements.length >= 1 && context.elements.length <= 10)
  t.match(JSON.stringify(context.elements), /agent `ch`/)
  t.equal(rx.got[0]!.headers['x-service-signature'], undefined, 'Slack gets no signature header')
  const [d] = (await gw.api('GET', `/v1/deliveries?alertId=${r.body.alertId}`)).body.deliveries
  t.notMatch(d.channel.url, /abcdefghij/, 'masked in the delivery log too')
})

t.test('email: a refused recipient is a failed attempt with the SMTP code, retried on the schedule', async (t) => {
  const r = await gw.api('POST', '/v1/alerts', { body: { agentId: 'ch', type: 'policy_violation', notify: { type: 'email', address: 'bounce@example.com' } } })
  await gw.api('POST', `/v1/alerts/${r.body.alertId}/test`)
  await gw.gw.notify.settle()
  const [d] = (await gw.api('GET', `/v1/deliveries?alertId=${r.body.alertId}`)).body.deliveries
  t.match(d, { status: 'retrying', attempts: [{ status: 550, error: /mailbox unavailable/ }] })
})
