import t from 'tap'
import { createPublicClient, custom, encodeFunctionResult, toFunctionSelector, type Hex, type PublicClient } from 'viem'
import { readTokenDomain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { PaygateError } from '../../src/errors/index.js'

/**
 * readTokenDomain's decisions, against a node stub that answers eth_call per selector (the
 * real tokens are in test/integration/token-domain.test.ts). A missing entry reverts.
 */
const TOKEN = '0x5FbDB2315678afecb367f032d93F642f64180aa3' as const
const CHAIN_ID = 84532
type Answers = Partial<Record<'eip712Domain' | 'name' | 'version', Hex>>
const selectorOf = (fn: keyof Answers) => toFunctionSelector(paygateUsdcAbi.find((e) => e.type === 'function' && e.name === fn) as never)

function stub(answers: Answers): { client: PublicClient; asked: string[] } {
  const asked: string[] = []
  const fnOf = new Map((['eip712Domain', 'name', 'version'] as const).map((fn) => [selectorOf(fn), fn]))
  const client = createPublicClient({
    transport: custom(
      {
        async request({ method, params }: { method: string; params?: unknown }) {
          if (method === 'eth_chainId') return `0x${CHAIN_ID.toString(16)}`
          if (method !== 'eth_call') throw new Error(`unexpected ${method}`)
          const data = ((params as [{ data?: Hex; input?: Hex }])[0].data ?? (params as [{ input: Hex }])[0].input).slice(0, 10)
          const fn = fnOf.get(data as Hex)
          asked.push(fn ?? data)
          const answer = fn && answers[fn]
          if (!answer) throw Object.assign(new Error('execution reverted'), { code: 3, data: '0x' })
          return answer
        },
      },
      { retryCount: 0 },
    ),
  }) as PublicClient
  return { client, asked }
}
const domain = (fields: Hex, name: string, version: string, chainId = BigInt(CHAIN_ID), contract: Hex = TOKEN): Hex =>
  encodeFunctionResult({ abi: paygateUsdcAbi, functionName: 'eip712Domain', result: [fields, name, version, chainId, contract, `0x${'00'.repeat(32)}`, []] })
const str = (fn: 'name' | 'version', v: string): Hex => encodeFunctionResult({ abi: paygateUsdcAbi, functionName: fn, result: v })

t.test('EIP-5267 first; name() and version() only when the token has no eip712Domain()', async (t) => {
  const a = stub({ eip712Domain: domain('0x0f', 'USDC', '2'), name: str('name', 'wrong'), version: str('version', '9') })
  t.same(await readTokenDomain(a.client, TOKEN, CHAIN_ID), { name: 'USDC', version: '2' })
  t.same(a.asked, ['eip712Domain'], 'one read')
  const b = stub({ name: str('name', 'USDC'), version: str('version', '2') })
  t.same(await readTokenDomain(b.client, TOKEN, CHAIN_ID), { name: 'USDC', version: '2' })
  t.same(b.asked.sort(), ['eip712Domain', 'name', 'version'])
})

t.test('a domain Paygate cannot sign over, or no answer at all, stops the start with a clear message', async (t) => {
  const cases: [string, Answers, RegExp][] = [
    ['a salt in the domain', { eip712Domain: domain('0x1f', 'USDC', '2') }, /EIP-712 domain \(fields 0x1f.*cannot be signed/],
    ['another chain id', { eip712Domain: domain('0x0f', 'USDC', '2', 1n) }, /chainId 1,/],
    [
      'another verifying contract',
      { eip712Domain: domain('0x0f', 'USDC', '2', BigInt(CHAIN_ID), '0x036CbD53842c5426634e7929541eC2318f3dCF7e') },
      /verifyingContract 0x036CbD53842c5426634e7929541eC2318f3dCF7e/,
    ],
    ['name() but no version()', { name: str('name', 'USDC') }, /answers neither eip712Domain\(\) nor name\(\) and version\(\) on chain 84532/],
    ['nothing', {}, /answers neither eip712Domain\(\) nor name\(\) and version\(\)/],
  ]
  for (const [name, answers, detail] of cases) {
    const err = await readTokenDomain(stub(answers).client, TOKEN, CHAIN_ID).catch((e: unknown) => e)
    t.type(err, PaygateError, name)
    t.match(err, { code: 'invalid_config', detail }, name)
    t.match((err as PaygateError).detail, `chain.token = ${TOKEN}`, name)
  }
})
