import type { Test } from 'tap'
import { OffsetClock } from '../../src/util/clock.js'
import { startTestGateway, testChain, type ApiResult, type TestGateway } from './gateway.js'
import { startV2Merchant, type Merchant } from './merchants.js'

/**
 * What the time-window tests start from: a test gateway on a clock they move, the official v2
 * merchant on its chain (0.01 USDC a call, its facilitator funded) and one agent with a wallet.
 * `pay()` pays the merchant's `/paid` as that agent.
 */
export async function clockedPayer(t: Test, agentId: string): Promise<{ gw: TestGateway; clock: OffsetClock; merchant: Merchant; pay: () => Promise<ApiResult> }> {
  const clock = new OffsetClock()
  const gw = await startTestGateway({ clock })
  t.teardown(() => gw.close())
  const m = await startV2Merchant(await (await testChain(gw)).merchantOptions(10_000n))
  t.teardown(() => m.close())
  await gw.api('POST', '/v1/agents', { body: { agentId } })
  await gw.api('POST', '/v1/wallets', { body: { agentId } })
  return { gw, clock, merchant: m, pay: () => gw.api('POST', '/v1/pay', { body: { agentId, endpoint: `${m.url}/paid` } }) }
}
