import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Test } from 'tap'
import { createPublicClient, createWalletClient, http, type Address } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { viemChain } from '../../src/chain/chain.js'
import { paygateUsdcAbi } from '../../src/chain/contracts/abis.js'
import { type Anvil, startAnvil } from './anvil.js'
import { testDir } from './gateway.js'
import { testDatabase } from './postgres.js'
import { type GatewayProcess, runCli, spawnGateway } from './process.js'

/** 100 ETH in wei, for gas. */
const GAS_MONEY = '0x56bc75e2d63100000'

/** A fresh private key whose address holds 100 ETH on `anvil`. */
export async function gasFundedKey(anvil: Anvil): Promise<`0x${string}`> {
  const key = generatePrivateKey()
  await anvil.request('anvil_setBalance', [privateKeyToAccount(key).address, GAS_MONEY])
  return key
}

export interface ReplicaChain {
  anvil: Anvil
  /** The deployed token and ledger. */
  addrs: { token: Address; ledger: Address }
  evm: ReturnType<typeof viemChain>
  pub: ReturnType<typeof createPublicClient>
  /** The throwaway database's URL. */
  url: string
  /** What every replica shares: the chain, its contracts and the database (not the master key). */
  env: Record<string, string>
  /** Transfers `amount` token base units from the bank to `to`, waiting for the receipt. */
  fund(to: Address, amount: bigint): Promise<void>
}

/**
 * The external chain replicas share: a standalone anvil (stopped at teardown) with a funded
 * ledger signer, `deploy-ledger --with-token`, and a throwaway PostgreSQL database. With
 * `bankUnits`, a bank is minted that many token units by the signer now, before any replica
 * starts: the signer's later nonces are the replicas' (a mint by it meanwhile would take one).
 */
export async function replicaChain(t: Test, chainId: number, bankUnits?: bigint): Promise<ReplicaChain> {
  const anvil = await startAnvil(chainId)
  t.teardown(() => anvil.stop())
  const signerKey = await gasFundedKey(anvil)
  const chain = { PAYGATE_CHAIN_RPC_URL: anvil.url, PAYGATE_CHAIN_CHAIN_ID: String(chainId), PAYGATE_CHAIN_SIGNER_KEY: signerKey }
  const dep = await runCli({ PAYGATE_DATA_DIR: testDir(t), ...chain }, ['deploy-ledger', '--with-token'], 90_000)
  t.equal(dep.code, 0, dep.stderr)
  const addrs = JSON.parse(dep.stdout) as { token: Address; ledger: Address }

  const evm = viemChain(chainId, 'ext', anvil.url)
  const pub = createPublicClient({ chain: evm, transport: http(anvil.url) })
  let fund: ReplicaChain['fund'] = async () => {
    throw new Error('replicaChain: no bank (pass bankUnits)')
  }
  if (bankUnits !== undefined) {
    const bankKey = await gasFundedKey(anvil)
    const owner = createWalletClient({ chain: evm, transport: http(anvil.url), account: privateKeyToAccount(signerKey) })
    await pub.waitForTransactionReceipt({
      hash: await owner.writeContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'mint', args: [privateKeyToAccount(bankKey).address, bankUnits] }),
    })
    const bank = createWalletClient({ chain: evm, transport: http(anvil.url), account: privateKeyToAccount(bankKey) })
    fund = async (to, amount) => {
      await pub.waitForTransactionReceipt({ hash: await bank.writeContract({ address: addrs.token, abi: paygateUsdcAbi, functionName: 'transfer', args: [to, amount] }) })
    }
  }

  const url = await testDatabase()
  const env = { ...chain, PAYGATE_CHAIN_TOKEN: addrs.token, PAYGATE_CHAIN_LEDGER: addrs.ledger, PAYGATE_STORE_POSTGRES_URL: url }
  return { anvil, addrs, evm, pub, url, env, fund }
}

/**
 * `n` gateway processes with `env`, each in a new data dir (90 s to start each: the machine may
 * be busy), SIGKILLed at teardown. `together`: started at once (the first account key and the
 * signer are set up by one of them); otherwise one after another, so the first creates the
 * account key. `acct`: that key.
 */
export async function spawnReplicas(t: Test, env: Record<string, string>, n: number, together: boolean): Promise<{ replicas: GatewayProcess[]; dirs: string[]; acct: string }> {
  // Data dirs that do not exist yet, as in a fresh clone: each replica makes its own.
  const dirs = Array.from({ length: n }, () => join(testDir(t), 'data'))
  const start = (d: string) => spawnGateway({ PAYGATE_DATA_DIR: d, ...env }, [], [], true, 90_000)
  const replicas: GatewayProcess[] = []
  if (together) replicas.push(...(await Promise.all(dirs.map(start))))
  else for (const d of dirs) replicas.push(await start(d))
  t.teardown(() => Promise.all(replicas.map((g) => g.stop('SIGKILL'))))
  const keyDir = together ? dirs.find((d) => existsSync(join(d, 'account-key'))) : dirs[0]
  const acct = readFileSync(join(keyDir!, 'account-key'), 'utf8').trim()
  return { replicas, dirs, acct }
}
