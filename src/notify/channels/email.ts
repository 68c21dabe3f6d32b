import { isIP } from 'node:net'
import { createTransport } from 'nodemailer'
import type { EgressGuard } from '../../net/egress.js'
import { describe } from './describe.js'
import type { AttemptResult } from './http.js'

export interface SmtpSettings {
  /** `smtp://user:pass@host:587` (STARTTLS when offered) or `smtps://…:465` (TLS from the start). */
  url: string
  from: string
}

const escapeHtml = (s: string): string => s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!)

/** Subject, text and HTML of one payload (docs/alerts.md shows them). */
export function emailContent(payload: Record<string, unknown>, deliveryId: string): { subject: string; text: string; html: string } {
  const d = describe(payload)
  const subject = `[Paygate] ${d.title}`
  const footer = `Event ${String(payload.event)} at ${String(payload.timestamp)}, delivery ${deliveryId}.`
  const text = [d.summary, '', ...d.fields.map(([k, v]) => `${k}: ${v}`), '', footer, '', 'JSON payload:', JSON.stringify(payload, null, 2), ''].join('\n')
  const rows = d.fields.map(([k, v]) => `<tr><th align="left" style="padding:4px 12px 4px 0">${escapeHtml(k)}</th><td style="padding:4px 0">${escapeHtml(v)}</td></tr>`).join('')
  const html = `<!doctype html><html><body style="font-family:sans-serif"><h2>${escapeHtml(d.title)}</h2><p>${escapeHtml(d.summary)}</p><table>${rows}</table><p style="color:#666;font-size:12px">${escapeHtml(footer)}</p></body></html>`
  return { subject, text, html }
}

/**
 * Send one message over SMTP (nodemailer). The server is checked by the egress guard as an
 * operator target, and nodemailer connects to the address that passed (TLS still verifies
 * the name). Delivered means the server accepted it (250).
 */
export async function sendEmail(egress: EgressGuard, smtp: SmtpSettings, to: string, payload: Record<string, unknown>, deliveryId: string, timeoutMs: number): Promise<AttemptResult> {
  let transport: ReturnType<typeof createTransport> | null = null
  let timer: NodeJS.Timeout | undefined
  try {
    const u = new URL(smtp.url)
    const secure = u.protocol === 'smtps:'
    const port = Number(u.port) || (secure ? 465 : 587)
    const host = u.hostname.replace(/^\[|\]$/g, '')
    const [addr] = await egress.check(host, port, { operator: true })
    transport = createTransport({
      host: addr!.address,
      port,
      secure,
      ...(u.username ? { auth: { user: decodeURIComponent(u.username), pass: decodeURIComponent(u.password) } } : {}),
      // TLS (and STARTTLS) verify the server's name, not the address connected to.
      ...(isIP(host) ? {} : { tls: { servername: host } }),
      connectionTimeout: timeoutMs,
      greetingTimeout: timeoutMs,
      socketTimeout: timeoutMs,
    })
    const { subject, text, html } = emailContent(payload, deliveryId)
    const sending = transport.sendMail({ from: smtp.from, to, subject, text, html, messageId: `<${deliveryId}@paygate>`, headers: { 'X-Paygate-Delivery': deliveryId } })
    // The whole exchange within timeoutMs, as for webhooks.
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs)
    })
    const info = await Promise.race([sending, expired])
    const code = Number(/^(\d{3})/.exec(String(info.response))?.[1] ?? 0)
    return code === 250 ? { status: 250, error: null } : { status: code || null, error: `SMTP answered ${String(info.response).slice(0, 200)}` }
  } catch (e) {
    const err = e as { responseCode?: number; message?: string }
    return { status: err.responseCode ?? null, error: String(err.message ?? e).slice(0, 300) }
  } finally {
    clearTimeout(timer)
    transport?.close()
  }
}
