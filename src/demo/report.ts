/** What the demo prints: each payment, and commands that work as written while it runs. */
import type { DemoTarget } from './target.js'

/** The fields of a transaction (`GET /v1/transactions/<txHash>`) the demo prints. */
export interface TxShown {
  id: string
  status: string
  protocol: string
  rail?: string
  network?: string
  amountPaid: { usdc: number }
  txHash: string
  settlement?: { transaction: string | null }
  ledger?: { status: string; blockNumber?: number }
}

export interface Paid {
  how: string
  url: string
  /** The transaction as `GET /v1/transactions/<txHash>` answers it. */
  tx: TxShown
  answer: string
}

export function paidLine(p: Paid): string[] {
  const { tx } = p
  return [
    `Paid through ${p.how}: GET ${p.url}`,
    `  price ${tx.amountPaid.usdc} USDC, protocol ${tx.protocol}${tx.rail ? ` (${tx.rail})` : ''}, network ${tx.network}, status ${tx.status}`,
    `  transaction ${tx.id}; merchant's settlement ${tx.settlement?.transaction ?? '(not reported)'}`,
    `  on-chain ledger record ${tx.txHash}: ${tx.ledger?.status ?? 'queued'}${tx.ledger?.blockNumber !== undefined ? ` in block ${tx.ledger.blockNumber}` : ''}`,
    `  answer: ${p.answer}`,
  ]
}

/** The dashboard's path on the API port (issue 25 serves it at `/`). */
export const DASHBOARD_PATH = '/'

/** `dashboard`: whether the gateway serves it (api.dashboard). */
export function commands(o: { t: DemoTarget; merchantUrl: string; agent: string; keyFile: string; dashboard: boolean }): string[] {
  const { t, merchantUrl, agent, keyFile } = o
  const proxy = new URL(t.proxyUrl)
  return [
    o.dashboard ? `Dashboard: ${t.apiUrl}${DASHBOARD_PATH}` : 'Dashboard: not served by this gateway (api.dashboard is false)',
    'Try it yourself (copy and paste; they work while the demo runs):',
    '',
    `  curl -s -x "http://${agent}:$(cat ${keyFile})@${proxy.host}" ${merchantUrl}/paid`,
    `  curl -s ${t.apiUrl}/v1/pay -H "Authorization: Bearer ${t.accountKeyShell}" -H 'Content-Type: application/json' -d '{"agentId":"${agent}","endpoint":"${merchantUrl}/mpp"}'`,
    `  curl -s "${t.apiUrl}/v1/transactions?agentId=${agent}&limit=5" -H "Authorization: Bearer ${t.accountKeyShell}"`,
    `  curl -s ${t.apiUrl}/v1/wallets/${agent} -H "Authorization: Bearer ${t.accountKeyShell}"`,
  ]
}
