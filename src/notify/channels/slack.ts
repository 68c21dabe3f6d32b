import type { ContextBlock, HeaderBlock, KnownBlock, SectionBlock } from '@slack/types'
import { describe } from './describe.js'

/** An incoming-webhook message: Block Kit blocks and the top-level `text` shown where blocks are not (notifications, old clients). */
export interface SlackMessage {
  text: string
  blocks: KnownBlock[]
}

/** A Block Kit message for one payload: a header, its fields as a section, and a context line with the agent and time. */
export function slackMessage(payload: Record<string, unknown>, deliveryId: string): SlackMessage {
  const d = describe(payload)
  const header: HeaderBlock = { type: 'header', text: { type: 'plain_text', text: d.title.slice(0, 150), emoji: false } }
  const fields: SectionBlock = {
    type: 'section',
    text: { type: 'mrkdwn', text: d.summary.slice(0, 3000) },
    // Block Kit: at most 10 fields of 2000 characters.
    fields: d.fields.slice(0, 10).map(([k, v]) => ({ type: 'mrkdwn', text: `*${k}*\n${v}`.slice(0, 2000) })),
  }
  const context: ContextBlock = {
    type: 'context',
    elements: [{ type: 'mrkdwn', text: `Paygate · agent \`${String(payload.agentId)}\` · ${String(payload.timestamp)} · delivery ${deliveryId}` }],
  }
  return { text: `${d.title}: ${d.summary}`, blocks: [header, fields, context] }
}
