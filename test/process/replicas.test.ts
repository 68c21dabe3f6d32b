import { existsSync } from 'node:fs'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import pg from 'pg'
import { createWalletClient, http, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { SCHEMA_VERSION } from '../../src/store/postgres-schema.js'
import { gasFundedKey, replicaChain, spawnReplicas } from '../helpers/replica-chain.js'
import { testDir } from '../helpers/gateway.js'
import { startV2Merchant } from '../helpers/merchants.js'
import { call, runCli, spawnGateway } from '../helpers/process.js'

// Three gateways, a chain and 300 payments on a 2-core machine shared with other tests: well past the default 240 s when busy.
t.setTimeout(600_000)

const CHAIN_ID = 31338
const MASTER_KEY = 'cd'.repeat(32)

/**
 * Paygate processes on one PostgreSQL database and one external chain (a standalone anvil with
 * `deploy-ledger --with-token`): they start together, set up once, and serve the same state.
 */
t.test('three gateway processes on one PostgreSQL database and one external chain', async (t) => {
  // Agents are funded by a bank minted before the replicas start: the ledger signer's later
  // nonces are the replicas' (a mint by it meanwhile would take one of theirs).
  const { anvil, addrs, evm, pub, url, env: shared, fund } = await replicaChain(t, CHAIN_ID, 100_000_000n)

  const noKey = await runCli({ PAYGATE_DATA_DIR: testDir(t), PAYGATE_API_PORT: '0', ...shared }, [], 90_000)
  t.equal(noKey.code, 2, 'a start without the master key is refused')
  t.match(noKey.stderr, /with store\.postgresUrl .* set masterKey \(PAYGATE_MASTER_KEY\), the same on every replica/)
  t.notOk(noKey.stderr.includes(url), 'the database URL is not shown')

  // Started together: the first account key, the master key check and the signer are set up
  // once. The others wait for the first's setup (and the machine may be busy): 90 s each.
  const { replicas, dirs, acct } = await spawnReplicas(t, { PAYGATE_MASTER_KEY: MASTER_KEY, ...shared }, 3, true)
  const [a, b, c] = replicas
  const keyFiles = dirs.filter((d) => existsSync(join(d, 'account-key')))
  t.equal(keyFiles.length, 1, 'one replica created the first account key; the others found it')
  for (const g of replicas) {
    t.same((await call(g.url, 'GET', '/readyz', null)).body.checks, { store: true, chain: true })
    t.ok(
      g.stdout.some((l) => l.includes('state in PostgreSQL')),
      'says where its state is',
    )
    t.notOk(
      [...g.stdout, ...g.stderr].some((l) => l.includes(url)),
      'the database URL is not logged',
    )
  }

  t.test('what one replica writes, the other reads', async (t) => {
    t.equal((await call(a!.url, 'POST', '/v1/agents', acct, { agentId: 'shared' })).status, 201)
    t.equal((await call(b!.url, 'GET', '/v1/agents/shared', acct)).status, 200, 'an agent created through A is found through B')
    const w = await call(b!.url, 'POST', '/v1/wallets', acct, { agentId: 'shared' })
    t.equal(w.status, 201, w.text)
    t.equal((await call(a!.url, 'GET', '/v1/wallets/shared', acct)).body.address, w.body.address, 'a wallet made by B is read, decrypted, by A')
    const issued = await call(a!.url, 'POST', '/v1/keys', acct, {})
    t.equal(issued.status, 201, issued.text)
    t.equal((await call(b!.url, 'GET', '/v1/agents/shared', issued.body.apiKey)).status, 200, 'a key issued through A works on B')
    t.equal((await call(a!.url, 'GET', '/v1/agents/shared', issued.body.apiKey)).status, 200, 'and on A (now in its verification cache)')
    t.equal((await call(b!.url, 'DELETE', `/v1/keys/${issued.body.keyId}`, acct)).status, 200, 'revoked through B')
    t.equal((await call(b!.url, 'GET', '/v1/agents/shared', issued.body.apiKey)).status, 401, 'refused on B')
    t.equal((await call(a!.url, 'GET', '/v1/agents/shared', issued.body.apiKey)).status, 401, 'refused on A at its next request')
    t.equal((await call(replicas[2]!.url, 'GET', '/v1/agents/shared', issued.body.apiKey)).status, 401, 'and on the third')
  })

  const PRICE = 1000n // 0.001 USDC
  const CALLS = 300

  /**
   * CALLS concurrent payments for a new agent with `policy`, spread over the three
   * replicas, to a new merchant (its own payee): exactly `allowed` pay, settle and land on
   * chain; every other call is refused for `reason`.
   */
  async function concurrentPayments(t: Test, agentId: string, policy: Record<string, unknown>, reason: string, allowed: number) {
    const facilitatorKey = await gasFundedKey(anvil)
    const payTo = privateKeyToAccount(generatePrivateKey()).address
    const m = await startV2Merchant({ chain: { rpcUrl: anvil.url, chainId: CHAIN_ID, token: addrs.token }, facilitatorKey, payTo, price: PRICE })
    t.teardown(() => m.close())
    t.equal((await call(a!.url, 'POST', '/v1/agents', acct, { agentId })).status, 201)
    const w = (await call(b!.url, 'POST', '/v1/wallets', acct, { agentId })).body
    await fund(w.address, 1_000_000n)
    t.equal((await call(a!.url, 'PUT', `/v1/policies/${agentId}`, acct, policy)).status, 200, 'policy set through A')

    const results = await Promise.all(Array.from({ length: CALLS }, (_, i) => call(replicas[i % replicas.length]!.url, 'POST', '/v1/pay', acct, { agentId, endpoint: `${m.url}/paid` })))
    const refused = (r: (typeof results)[number]): boolean => r.status === 402 && r.body?.error === 'policy_violation' && r.body?.reason === reason
    t.equal(results.filter((r) => r.status === 200).length, allowed, `exactly ${allowed} paid`)
    t.equal(results.filter(refused).length, CALLS - allowed, `the other ${CALLS - allowed} refused: ${reason}`)
    t.same([...new Set(results.filter((r) => r.status !== 200 && !refused(r)).map((r) => r.text))], [], 'no other outcome')
    t.equal(m.stats.settleCalls, allowed, `the merchant settled ${allowed}`)
    const received = await pub.readContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [payTo] })
    t.equal(received, BigInt(allowed) * PRICE, `exactly ${allowed} payments on chain`)
    await ledgerConfirmed(t, agentId, allowed)
    return (await call(b!.url, 'GET', `/v1/policies/${agentId}`, acct)).body
  }

  /**
   * The replicas record with one ledger signer, nonces taken from the database: every paid
   * record's ledger entry is mined (none lost to a nonce another replica used). Bounded wait.
   */
  async function ledgerConfirmed(t: Test, agentId: string, paid: number) {
    let txs: { txHash: string; ledger?: { status: string } }[] = []
    for (let i = 0; i < 300; i++) {
      txs = (await call(replicas[i % replicas.length]!.url, 'GET', `/v1/transactions?agentId=${agentId}&status=paid`, acct)).body.transactions
      if (txs.length === paid && txs.every((x) => x.ledger?.status === 'confirmed')) break
      await new Promise((r) => setTimeout(r, 100))
    }
    if (!txs.every((x) => x.ledger?.status === 'confirmed'))
      t.comment(
        replicas
          .flatMap((g) => [...g.stdout, ...g.stderr])
          .filter((l) => /ledger|outbox|nonce/i.test(l))
          .slice(-30)
          .join('\n'),
      )
    t.equal(txs.length, paid, `${paid} paid records`)
    t.same(
      txs.map((x) => x.ledger?.status),
      Array(paid).fill('confirmed'),
      'each with its ledger record mined',
    )
    t.equal(new Set(txs.map((x) => x.txHash)).size, paid, 'under distinct ledger transactions')
  }

  t.test(`${CALLS} concurrent payments across three replicas against a daily budget that allows exactly 10`, async (t) => {
    await concurrentPayments(t, 'budget', { dailyBudget: { usdc: 0.01 } }, 'daily_budget_exceeded', 10)
    // Read through every replica until the last commit is seen (bounded; on PostgreSQL it is in before the 200).
    let used = 0
    for (let i = 0; i < 200 && used !== 0.01; i++) {
      used = (await call(replicas[i % replicas.length]!.url, 'GET', '/v1/policies/budget', acct)).body.dailyBudget.usedToday
      if (used !== 0.01) await new Promise((r) => setTimeout(r, 50))
    }
    t.equal(used, 0.01, 'the shared usage shows the whole budget used')
  })

  t.test(`${CALLS} concurrent payments across three replicas against a rate limit of 7 an hour`, async (t) => {
    const policy = await concurrentPayments(t, 'rate', { rateLimit: { calls: 7, window: '1h' } }, 'rate_limit_exceeded', 7)
    t.equal(policy.rateLimit.usedThisHour, 7, 'the shared rate window counts them all')
  })

  /** A sub-agent on loopback: each task POSTed to `/<name>` runs `work[name]` with the invocation's token; answers `{output}`. */
  async function subAgent(t: Test, work: Record<string, (token: string) => Promise<unknown>>): Promise<string> {
    const srv = createServer(async (req, res) => {
      for await (const _ of req);
      const output = await work[req.url!.slice(1)]!(String(req.headers['x-paygate-invocation']))
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ output }))
    })
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
    t.teardown(() => {
      srv.closeAllConnections()
      return new Promise<void>((r) => srv.close(() => r()))
    })
    return `http://127.0.0.1:${(srv.address() as AddressInfo).port}`
  }

  /** A new agent with a funded wallet (created through A, funded by the bank); its agent key. */
  async function fundedAgent(agentId: string, policy?: Record<string, unknown>): Promise<string> {
    const key = (await call(a!.url, 'POST', '/v1/agents', acct, { agentId })).body.apiKey as string
    const w = (await call(b!.url, 'POST', '/v1/wallets', acct, { agentId })).body
    await fund(w.address, 1_000_000n)
    if (policy) await call(a!.url, 'PUT', `/v1/policies/${agentId}`, acct, policy)
    return key
  }

  const post = async (base: string, path: string, key: string, headers: Record<string, string>, body: unknown) => {
    const res = await fetch(base + path, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) })
    const text = await res.text()
    return { status: res.status, body: text ? JSON.parse(text) : undefined, text }
  }

  t.test(`${CALLS} concurrent payments across three replicas under an invocation cap that allows exactly 10`, async (t) => {
    const facilitatorKey = await gasFundedKey(anvil)
    const payTo = privateKeyToAccount(generatePrivateKey()).address
    const m = await startV2Merchant({ chain: { rpcUrl: anvil.url, chainId: CHAIN_ID, token: addrs.token }, facilitatorKey, payTo, price: PRICE })
    t.teardown(() => m.close())
    const orchKey = await fundedAgent('orch', { dailyBudget: { usdc: 1 } })
    const subKey = await fundedAgent('isub')
    // The sub-agent pays with the token through all three replicas at once; the cap opened on A holds on each.
    const sub = await subAgent(t, {
      crawl: async (token) => {
        const results = await Promise.all(
          Array.from({ length: CALLS }, (_, i) => post(replicas[i % replicas.length]!.url, '/v1/pay', subKey, { 'x-paygate-invocation': token }, { agentId: 'isub', endpoint: `${m.url}/paid` })),
        )
        const byOutcome: Record<string, number> = {}
        for (const r of results) {
          const k = r.status === 200 ? 'paid' : `${r.status} ${r.body?.error}`
          byOutcome[k] = (byOutcome[k] ?? 0) + 1
        }
        return byOutcome
      },
    })
    const r = await post(a!.url, '/v1/agents/invoke', orchKey, { 'x-agent-id': 'orch' }, { agentEndpoint: `${sub}/crawl`, task: { q: 'everything' }, budget: { usdc: 0.01 } })
    t.equal(r.status, 200, r.text)
    t.same(r.body.output, { paid: 10, '402 budget_exceeded': CALLS - 10 }, 'exactly 10 paid across the replicas; the other 290 refused by the cap')
    t.same(r.body.totalCost, { usdc: 0.01 }, 'the invocation cost its cap')
    t.equal(r.body.paymentChain.length, 10, 'ten payments in its chain')
    t.equal(new Set(r.body.paymentChain).size, 10, 'each once')
    t.equal(m.stats.settleCalls, 10, 'the merchant settled 10')
    t.equal(await pub.readContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [payTo] }), 10n * PRICE, 'exactly 10 payments on chain')
    await ledgerConfirmed(t, 'isub', 10)
    const tree = await call(c!.url, 'GET', `/v1/transactions/${r.body.txHash}/tree`, acct)
    t.same([tree.body.totalCost, tree.body.txCount], [{ usdc: 0.01 }, 10], 'the tree, read through another replica')
    t.equal((await call(b!.url, 'GET', '/v1/policies/orch', acct)).body.dailyBudget.usedToday, 0, "the orchestrator's cap hold is released (it spent nothing itself)")
  })

  t.test('an invocation whose replica is SIGKILLed: closed as interrupted by another once its lease ends, its cap hold released', async (t) => {
    const orchKey = await fundedAgent('orph', { dailyBudget: { usdc: 1 } })
    let started!: () => void
    const working = new Promise<void>((r) => (started = r))
    const sub = await subAgent(t, {
      hang: () => {
        started()
        return new Promise(() => {})
      },
      quick: async () => 'done',
    })
    const doomed = await spawnGateway({ PAYGATE_DATA_DIR: testDir(t), PAYGATE_MASTER_KEY: MASTER_KEY, PAYGATE_INVOKE_TIMEOUT_MS: '120000', ...shared }, [], [], true, 90_000)
    t.teardown(() => doomed.stop('SIGKILL'))
    const cut = post(doomed.url, '/v1/agents/invoke', orchKey, { 'x-agent-id': 'orph' }, { agentEndpoint: `${sub}/hang`, task: {}, budget: { usdc: 0.5 } }).catch(() => null)
    await working
    t.equal(await doomed.stop('SIGKILL'), 'SIGKILL')
    await cut
    const invokeOn = (g: (typeof replicas)[number], usdc: number) => post(g.url, '/v1/agents/invoke', orchKey, { 'x-agent-id': 'orph' }, { agentEndpoint: `${sub}/quick`, task: {}, budget: { usdc } })
    const listed = async () => (await call(b!.url, 'GET', '/v1/transactions?agentId=orph', acct)).body.transactions as { kind?: string; status: string; reason?: string }[]
    const roots = async () => (await listed()).filter((x) => x.kind === 'invocation')
    t.same(
      (await roots()).map((x) => [x.kind, x.status]),
      [['invocation', 'open']],
      'still open while its replica may be alive',
    )
    const refused = await invokeOn(b!, 0.6)
    t.same([refused.status, refused.body.reason], [402, 'daily_budget_exceeded'], 'its cap hold still counts against the daily budget')
    t.same(
      (await listed()).filter((x) => x.status === 'rejected').map((x) => x.reason),
      ['daily_budget_exceeded'],
      'the refusal is listed, as a payment refusal is',
    )
    let now = await roots()
    for (let i = 0; i < 240 && now[0]?.status === 'open'; i++) {
      await new Promise((r) => setTimeout(r, 250))
      now = await roots()
    }
    t.same(
      now.map((x) => [x.kind, x.status]),
      [['invocation', 'interrupted']],
      'closed as interrupted by a surviving replica after the lease',
    )
    const whole = await invokeOn(c!, 1)
    t.equal(whole.status, 200, `the whole daily budget is free again: ${whole.text}`)
  })

  t.test('50 concurrent calls with one idempotency key across the replicas pay once', async (t) => {
    const facilitatorKey = await gasFundedKey(anvil)
    const payTo = privateKeyToAccount(generatePrivateKey()).address
    const m = await startV2Merchant({ chain: { rpcUrl: anvil.url, chainId: CHAIN_ID, token: addrs.token }, facilitatorKey, payTo, price: PRICE })
    t.teardown(() => m.close())
    const w = (await call(a!.url, 'POST', '/v1/wallets', acct, { agentId: 'idem' })).body
    await fund(w.address, 1_000_000n)
    const body = { agentId: 'idem', endpoint: `${m.url}/paid`, idempotencyKey: 'once-across-replicas' }
    const results = await Promise.all(Array.from({ length: 50 }, (_, i) => call(replicas[i % replicas.length]!.url, 'POST', '/v1/pay', acct, body)))
    t.same([...new Set(results.map((r) => r.status))], [200], 'every call answered 200')
    t.equal(new Set(results.map((r) => r.body.txHash)).size, 1, 'with one transaction')
    t.equal(m.stats.settleCalls, 1, 'settled once')
    const received = await pub.readContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [payTo] })
    t.equal(received, PRICE, 'paid once on chain')
    await ledgerConfirmed(t, 'idem', 1)
  })

  t.test('a replica SIGKILLed mid-payment: the others leave it alone while its lease lives, then settle it once', async (t) => {
    const facilitator = privateKeyToAccount(generatePrivateKey())
    await anvil.request('anvil_setBalance', [facilitator.address, '0x56bc75e2d63100000'])
    const wc = createWalletClient({ account: facilitator, chain: evm, transport: http(anvil.url) })
    // A spec-shape target that settles the payment on chain and never answers.
    const payTo = privateKeyToAccount(generatePrivateKey()).address
    let settlements = 0
    const srv: Server = createServer(async (req, res) => {
      const xp = req.headers['x-payment']
      if (!xp) {
        const resource = `http://127.0.0.1:${(srv.address() as AddressInfo).port}${req.url}`
        return void res
          .writeHead(402, { 'content-type': 'application/json' })
          .end(JSON.stringify({ scheme: 'exact', network: `eip155:${CHAIN_ID}`, token: addrs.token, amount: '50000', payTo, resource }))
      }
      const p = JSON.parse(Buffer.from(String(xp), 'base64').toString()).payload
      const hash = await wc.writeContract({
        address: addrs.token,
        abi: paygateUsdcAbi,
        functionName: 'transferWithAuthorization',
        args: [p.from, p.to, BigInt(p.amount), BigInt(p.validAfter), BigInt(p.validBefore), p.nonce, req.headers['x-payment-signature'] as Hex],
      })
      if ((await pub.waitForTransactionReceipt({ hash })).status === 'success') settlements++
    })
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
    t.teardown(() => {
      srv.closeAllConnections()
      return new Promise<void>((r) => srv.close(() => r()))
    })
    const w = (await call(a!.url, 'POST', '/v1/wallets', acct, { agentId: 'cut' })).body
    t.equal((await call(a!.url, 'PUT', '/v1/policies/cut', acct, { dailyBudget: { usdc: 1 } })).status, 200)
    await fund(w.address, 1_000_000n)
    const doomed = await spawnGateway({ PAYGATE_DATA_DIR: testDir(t), PAYGATE_MASTER_KEY: MASTER_KEY, PAYGATE_PAY_TIMEOUT_MS: '60000', ...shared }, [], [], true, 90_000)
    t.teardown(() => doomed.stop('SIGKILL'))
    const cut = call(doomed.url, 'POST', '/v1/pay', acct, { agentId: 'cut', endpoint: `http://127.0.0.1:${(srv.address() as AddressInfo).port}/report` }).catch(() => null)
    for (let i = 0; i < 400 && settlements === 0; i++) await new Promise((r) => setTimeout(r, 50))
    t.equal(settlements, 1, 'the target settled the payment')
    t.equal(await doomed.stop('SIGKILL'), 'SIGKILL')
    await cut

    const txOf = async (g: (typeof replicas)[number]) => (await call(g.url, 'GET', '/v1/transactions?agentId=cut', acct)).body.transactions as { status: string; amountPaid: { usdc: number } }[]
    // Its lease outlives it by up to its TTL (15 s): right after the kill the payment is still its own.
    t.same(
      (await txOf(b!)).map((x) => x.status),
      ['pending'],
      'another replica does not touch it while the lease lives',
    )
    let txs = await txOf(b!)
    for (let i = 0; i < 240 && txs[0]?.status !== 'paid'; i++) {
      await new Promise((r) => setTimeout(r, 250))
      txs = await txOf(replicas[i % replicas.length]!)
    }
    t.same(
      txs.map((x) => [x.status, x.amountPaid.usdc]),
      [['paid', 0.05]],
      'then a surviving replica settles it as the chain says: paid, once',
    )
    t.equal(settlements, 1, 'never paid a second time')
    t.equal(await pub.readContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [payTo] }), 50_000n, 'the target received it once')
    t.equal((await call(c!.url, 'GET', '/v1/policies/cut', acct)).body.dailyBudget.usedToday, 0.05, 'counted once in the usage')
  })

  t.test('a replica that finds a newer schema refuses to start, saying so', async (t) => {
    const c = new pg.Client({ connectionString: url })
    await c.connect()
    t.teardown(() => c.end())
    await c.query("INSERT INTO paygate_migrations (version, name) VALUES ($1, 'from a newer paygate')", [SCHEMA_VERSION + 1])
    const late = await runCli({ PAYGATE_DATA_DIR: testDir(t), PAYGATE_API_PORT: '0', PAYGATE_MASTER_KEY: MASTER_KEY, ...shared }, [], 90_000)
    await c.query('DELETE FROM paygate_migrations WHERE version = $1', [SCHEMA_VERSION + 1])
    t.not(late.code, 0)
    t.match(late.stderr, new RegExp(`cannot start: .*schema is at version ${SCHEMA_VERSION + 1}, newer than this Paygate knows \\(${SCHEMA_VERSION}\\).*refusing to start`))
  })
})
