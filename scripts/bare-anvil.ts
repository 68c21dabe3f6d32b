/**
 * What the standalone anvil scripts (anvil-rss.ts, anvil-block-costs.ts) share: waiting for a
 * freshly started anvil to answer, and deploying the PaymentLedger on it.
 */
import * as fs from 'node:fs'
import type { Hex } from 'viem'
import type { mnemonicToAccount } from 'viem/accounts'

type Call = (method: string, params?: unknown[]) => Promise<unknown>

/** Resolves once anvil answers `eth_chainId` (it was just started; ~10 s at most). */
export async function anvilAnswers(call: Call): Promise<void> {
  for (let i = 0; ; i++) {
    try {
      await call('eth_chainId')
      return
    } catch (e) {
      if (i > 500) throw e
      await new Promise((r) => setTimeout(r, 20))
    }
  }
}

/** Deploys the PaymentLedger from `by` with `nonce`, mines it, and resolves its address as bytes. */
export async function deployLedger(call: Call, by: ReturnType<typeof mnemonicToAccount>, chainId: number, nonce: number): Promise<Buffer> {
  const art = JSON.parse(fs.readFileSync(new URL('../src/chain/contracts/artifacts.json', import.meta.url), 'utf8')) as { PaymentLedger: { bytecode: Hex } }
  const deploy = await by.signTransaction({ chainId, type: 'eip1559', data: art.PaymentLedger.bytecode, nonce, gas: 5_000_000n, maxFeePerGas: 100_000_000_000n, maxPriorityFeePerGas: 1n })
  const h = await call('eth_sendRawTransaction', [deploy])
  await call('evm_mine')
  const r = (await call('eth_getTransactionReceipt', [h])) as { contractAddress: Hex }
  return Buffer.from(r.contractAddress.slice(2), 'hex')
}
