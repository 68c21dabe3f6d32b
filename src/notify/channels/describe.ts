/** Human wording of an event payload, shared by the e-mail and Slack channels. */
export interface Described {
  title: string
  summary: string
  fields: [string, string][]
}

const usd = (v: unknown): string => `${String(v)} USDC`

export function describe(p: Record<string, unknown>): Described {
  const agent = String(p.agentId)
  switch (p.event) {
    case 'policy.violation':
      return {
        title: `Payment refused for agent ${agent}`,
        summary: `A payment by ${agent} was refused by its spend policy (${String(p.reason)}).`,
        fields: [
          ['Reason', String(p.reason)],
          ['Detail', String(p.detail)],
          ['Endpoint', String(p.endpoint)],
        ],
      }
    case 'budget.warning':
      return {
        title: `Agent ${agent} used ${String(p.usedPct)}% of its daily budget`,
        summary: `${agent} has spent ${usd(p.usedUsdc)} of its ${usd(p.dailyBudgetUsdc)} daily budget (warning at ${String(p.threshold)}%).`,
        fields: [
          ['Threshold', `${String(p.threshold)}%`],
          ['Used', `${String(p.usedPct)}%`],
          ['Spent', usd(p.usedUsdc)],
          ['Daily budget', usd(p.dailyBudgetUsdc)],
        ],
      }
    case 'spend_rate.exceeded':
      return {
        title: `Agent ${agent} spent over ${usd(p.thresholdUsdc)} in ${String(p.window)}`,
        summary: `${agent} spent ${usd(p.spentUsdc)} within the last ${String(p.window)}, more than the alert's ${usd(p.thresholdUsdc)}.`,
        fields: [
          ['Window', String(p.window)],
          ['Spent', usd(p.spentUsdc)],
          ['Threshold', usd(p.thresholdUsdc)],
        ],
      }
    default:
      return {
        title: `Test notification for agent ${agent}`,
        summary: `Alert ${String(p.alertId)} (${String(p.type)}) reaches this channel.`,
        fields: [
          ['Alert', String(p.alertId)],
          ['Type', String(p.type)],
        ],
      }
  }
}
