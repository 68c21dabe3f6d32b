import t from 'tap'
import { generatePrivateKey } from 'viem/accounts'
import { startTestGateway, testDir } from '../helpers/gateway.js'

/** The embedded chain's ledger was deployed by the first start's signer: another signer cannot record, and start-up says so. */
t.test('the embedded chain started with another chain.signerKey warns that ledger records will fail', async (t) => {
  const dataDir = testDir(t)
  const warned = (logs: string[]) => logs.some((l) => l.includes('"level":"warn"') && l.includes('not a recorder on the ledger'))

  const first = await startTestGateway({ dataDir })
  t.notOk(warned(first.logs), 'the deploying signer records')
  await first.close({ keepData: true })

  const second = await startTestGateway({ dataDir, env: { PAYGATE_CHAIN_SIGNER_KEY: generatePrivateKey() } })
  t.teardown(() => second.close({ keepData: true }))
  t.ok(warned(second.logs), 'a new signer is warned about')
})
