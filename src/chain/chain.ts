import { getAddress, createPublicClient, createWalletClient, custom, type Chain as ViemChain, type Hex, type PublicClient, type Transport, type WalletClient } from 'viem'
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from 'viem/accounts'
import { join } from 'node:path'
import type { Config } from '../config/load.js'
import { PaygateError } from '../errors/index.js'
import type { Logger } from '../log/index.js'
import type { TokenDomain } from '../protocols/types.js'
import type { Collection } from '../store/index.js'
import { parseDecimal } from '../util/money.js'
import { KeyedMutex } from '../util/mutex.js'
import { shownUrl } from '../util/redact.js'
import { FastSigner } from '../crypto/secp256k1.js'
import type { Keystore } from '../wallet/keystore.js'
import { bytecodes, paygateUsdcAbi, paymentLedgerAbi } from './contracts/abis.js'
import { listeningPorts } from './devnet/anvil.js'
import type { Devnet, SendResult } from './devnet/index.js'
import { startDevnetThread } from './devnet/thread.js'
import { portTaken } from '../util/ports.js'
import { instrumented, transportFor, unanswered } from './rpc.js'
import { readTokenDomain } from './token-domain.js'
import { LedgerSigner } from './ledger-signer.js'
import { ZERO32 } from './ledger-tx.js'

export { readTokenDomain } from './token-domain.js'

export type Address = `0x${string}`

export interface ChainInfo {
  network: string
  chainId: number
  /** As shown (logs, `GET /v1/chain`): an external URL with credentials, a path or a query is its origin alone. */
  rpcUrl: string
  token: Address
  /** The token's EIP-712 domain name and version, as the token reports them (read at start). */
  tokenDomain: TokenDomain
  ledger: Address
}

interface Deployment {
  token: Address
  ledger: Address
  deployedAt: string
}

const SIGNER_CONTEXT = 'chain-signer'
const EMBEDDED_NETWORK = 'paygate-devnet'
/** Names for well-known chain ids; anything else is `evm-<id>`. */
const KNOWN_NETWORKS: Record<number, string> = {
  1: 'ethereum-mainnet',
  8453: 'base-mainnet',
  84532: 'base-sepolia',
  10: 'optimism-mainnet',
  42161: 'arbitrum-mainnet',
  137: 'polygon-mainnet',
}

export const networkNameFor = (chainId: number): string => KNOWN_NETWORKS[chainId] ?? `evm-${chainId}`

/**
 * An offer's network in the one style the API shows (`<chain>-<net>`, as wallets and
 * `/v1/chain` name it): CAIP-2 `eip155:<id>` becomes this chain's name for its own id, else
 * the well-known name; names already in that style (x402 v1's `base-sepolia`) stay, unless
 * they name this chain's id (a dev chain on 84532 is shown by its own name).
 */
export function networkShown(offered: string, chain: { chainId: number; network: string }): string {
  const m = /^eip155:(\d+)$/.exec(offered)
  const id = m ? Number(m[1]) : Number(Object.keys(KNOWN_NETWORKS).find((k) => KNOWN_NETWORKS[Number(k)] === offered) ?? Number.NaN)
  if (id === chain.chainId) return chain.network
  return m ? networkNameFor(id) : offered
}

export function viemChain(chainId: number, name: string, rpcUrl: string): ViemChain {
  return {
    id: chainId,
    name,
    nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: [rpcUrl] } },
  }
}

/**
 * The settlement chain (viem lives here and in wallet/): the embedded devnet by default,
 * or an external chain by config. Owns the service signer (gas for ledger records and the
 * dev faucet) and the token and ledger contracts.
 */
export class Chain {
  private readonly sendLock = new KeyedMutex()

  private constructor(
    readonly info: ChainInfo,
    readonly embedded: boolean,
    readonly publicClient: PublicClient,
    readonly walletClient: WalletClient,
    readonly signer: PrivateKeyAccount,
    /** The same signer key, signing natively (the ledger outbox's hot path). */
    readonly fastSigner: FastSigner,
    private readonly devnet: Devnet | null,
    /** Embedded chain only: owns the dev token and mints for the faucet (never the ledger signer, whose nonces the outbox manages). */
    private readonly minter: PrivateKeyAccount | null,
    /** Ledger records go to the chain unsigned, from the signer's account impersonated (the embedded chain; see sendLedger). */
    readonly unsignedLedger: boolean,
  ) {}

  static async start(config: Config, deps: { meta: Collection<unknown>; keystore: Keystore; log: Logger; signedLedger?: boolean }): Promise<Chain> {
    const { meta, keystore, log } = deps
    const c = config.chain
    let devnet: Devnet | null = null
    let transport: Transport
    let rpcUrl: string
    if (c.rpcUrl) {
      rpcUrl = c.rpcUrl
      transport = transportFor(rpcUrl)
      if (!c.token || !c.ledger) {
        throw new PaygateError('invalid_config', 'with chain.rpcUrl, set chain.token (PAYGATE_CHAIN_TOKEN) and chain.ledger (PAYGATE_CHAIN_LEDGER); `paygate deploy-ledger` deploys a ledger')
      }
    } else {
      devnet = await startDevnetThread({
        dataDir: join(config.dataDir, 'chain'),
        chainId: c.chainId,
        host: c.rpcHost,
        port: c.rpcPort,
        ...(c.anvilPath ? { anvilPath: c.anvilPath } : {}),
        log: (msg, fields, level) => log[level ?? 'info']({ component: 'devnet', ...fields }, msg),
      }).catch((e: NodeJS.ErrnoException) => {
        throw e.code === 'EADDRINUSE' ? portTaken('chain.rpcPort', c.rpcHost, c.rpcPort) : e
      })
      rpcUrl = devnet.rpcUrl
      transport = custom({ request: (args) => devnet!.request(args as { method: string; params?: unknown[] }) })
    }
    transport = instrumented(transport)
    try {
      const network = c.network ?? (devnet ? EMBEDDED_NETWORK : networkNameFor(c.chainId))
      const chain = viemChain(c.chainId, network, rpcUrl)
      const pollingInterval = devnet ? 20 : 1000
      const publicClient = createPublicClient({ chain, transport, pollingInterval }) as PublicClient
      const reported = await publicClient.getChainId().catch((e: unknown) => {
        throw new PaygateError('invalid_config', `chain at ${shownUrl(rpcUrl)} does not answer: ${(e as Error).message.split('\n')[0]}`)
      })
      if (reported !== c.chainId) {
        throw new PaygateError('invalid_config', `chain.chainId = ${c.chainId} but the chain at ${shownUrl(rpcUrl)} reports ${reported}`)
      }
      const signerKey = await loadKey(c.signerKey, meta, keystore, 'signerKey')
      const signer = privateKeyToAccount(signerKey)
      const minter = devnet ? await loadSigner(null, meta, keystore, 'minterKey') : null
      const walletClient = createWalletClient({ chain, transport, account: signer, pollingInterval })

      let deployment: Deployment
      if (devnet) {
        // Topped up only when low: a write here would be journalled on every start and
        // force a full chain snapshot at every shutdown.
        for (const a of [signer.address, minter!.address]) {
          if ((await publicClient.getBalance({ address: a })) < 10n ** 23n) await setNativeBalance(publicClient, a, 10n ** 24n)
        }
        deployment = await embeddedDeployment(publicClient, walletClient, signer, minter!.address, meta, c.chainId, log)
      } else {
        deployment = { token: c.token!, ledger: c.ledger!, deployedAt: '' }
        for (const [name, addr] of [
          ['chain.token', c.token!],
          ['chain.ledger', c.ledger!],
        ] as const) {
          const code = await publicClient.getCode({ address: addr })
          if (!code || code === '0x') throw new PaygateError('invalid_config', `${name} = ${addr}: no contract there on chain ${c.chainId}`)
        }
      }
      // Also on the embedded chain: its ledger was deployed by the signer of the first start, and
      // a changed chain.signerKey cannot record on it.
      const [recorder, tokenDomain] = await Promise.all([
        publicClient.readContract({ address: deployment.ledger, abi: paymentLedgerAbi, functionName: 'isRecorder', args: [signer.address] }),
        readTokenDomain(publicClient, deployment.token, c.chainId),
      ])
      if (!recorder) log.warn({ signer: signer.address, ledger: deployment.ledger }, 'the service signer is not a recorder on the ledger: ledger records will fail')
      const info: ChainInfo = { network, chainId: c.chainId, rpcUrl: shownUrl(rpcUrl), token: deployment.token, tokenDomain, ledger: deployment.ledger }
      const fastSigner = new FastSigner(signerKey)
      let unsigned = false
      if (devnet && !deps.signedLedger) {
        const nonce = await publicClient.getTransactionCount({ address: signer.address, blockTag: 'pending' })
        unsigned = await unsignedHashesAgree(devnet, fastSigner, info, nonce, log)
      }
      log.info({ ...info, embedded: !!devnet, signer: signer.address, unsignedLedger: unsigned }, 'chain ready')
      return new Chain(info, !!devnet, publicClient, walletClient, signer, fastSigner, devnet, minter, unsigned)
    } catch (e) {
      await devnet?.close()
      throw e
    }
  }

  /** Asked anew each time: viem's getBlockNumber hands later callers a request still in flight, so one that hung kept /readyz failing after the node recovered. */
  async blockNumber(): Promise<bigint> {
    return BigInt(await this.publicClient.request({ method: 'eth_blockNumber' }).catch(unanswered))
  }

  /**
   * EIP-3009 `authorizationState` of the token: true once `nonce` of `from` was used (or
   * canceled); at block `at` when given, else the newest.
   */
  async authorizationUsed(from: Address, nonce: Hex, at?: bigint): Promise<boolean> {
    return this.publicClient.readContract({
      address: this.info.token,
      abi: paygateUsdcAbi,
      functionName: 'authorizationState',
      args: [from, nonce],
      ...(at !== undefined ? { blockNumber: at } : {}),
    })
  }

  /**
   * Whether an EIP-3009 authorization valid before `validBefore` (seconds) can be shown unused
   * for good: 'used', 'unused' (not used in a block at or after validBefore, so never can be),
   * or 'open' (not used yet, and the chain has not reached validBefore).
   */
  async authorizationFate(from: Address, nonce: Hex, validBefore: bigint): Promise<'used' | 'unused' | 'open'> {
    const head = await this.publicClient.getBlock({ blockTag: 'latest' }).catch(unanswered)
    const used = await this.authorizationUsed(from, nonce, head.number).catch(unanswered)
    if (used) return 'used'
    return head.timestamp >= validBefore ? 'unused' : 'open'
  }

  async balanceOf(address: Address): Promise<bigint> {
    return this.publicClient.readContract({ address: this.info.token, abi: paygateUsdcAbi, functionName: 'balanceOf', args: [address] }).catch(unanswered)
  }

  /** Embedded chain: the ports anvil itself listens on (its HTTP JSON-RPC, which Paygate does not use); else none. */
  anvilPorts(): number[] {
    return this.devnet ? listeningPorts(this.devnet.childPid) : []
  }

  /** Dev faucet (embedded chain only): mint USDC base units and set the native gas balance. */
  async faucet(to: Address, usdcUnits: bigint, gasWei: bigint): Promise<void> {
    if (!this.embedded || !this.minter) throw new PaygateError('forbidden', 'the faucet exists only on the embedded dev chain')
    if (gasWei > 0n) await setNativeBalance(this.publicClient, to, gasWei)
    if (usdcUnits > 0n) {
      const minter = this.minter
      await this.send((walletClient) =>
        walletClient.writeContract({
          address: this.info.token,
          abi: paygateUsdcAbi,
          functionName: 'mint',
          args: [to, usdcUnits],
          account: minter,
          chain: walletClient.chain,
        }),
      )
    }
  }

  /** Send one faucet/admin transaction at a time (no nonce races) and wait for its receipt. */
  async send(write: (w: WalletClient) => Promise<Hex>): Promise<Hex> {
    return this.sendLock.run('signer', async () => {
      const hash = await write(this.walletClient)
      const receipt = await this.publicClient.waitForTransactionReceipt({ hash, timeout: 60_000 })
      if (receipt.status !== 'success') throw new PaygateError('internal_error', `transaction ${hash} reverted`)
      return hash
    })
  }

  /**
   * The signer's ledger transactions, in nonce order; per transaction its hash or the node's
   * error. The embedded chain takes signed and unsigned ones (`unsignedLedger`) in one round
   * trip (Devnet.sendLedger); an external node gets signed ones one by one.
   */
  async sendLedger(raws: Hex[]): Promise<SendResult[]> {
    if (this.devnet) return this.devnet.sendLedger(this.signer.address, raws)
    const out: SendResult[] = []
    for (const raw of raws) {
      try {
        out.push({ hash: (await this.publicClient.request({ method: 'eth_sendRawTransaction', params: [raw] })) as string })
      } catch (e) {
        out.push({ error: { code: (e as { code?: number }).code ?? -32603, message: String((e as Error).message ?? e) } })
      }
    }
    return out
  }

  async close(): Promise<void> {
    await this.devnet?.close()
  }
}

/**
 * Whether the embedded chain gives an unsigned ledger record the hash Paygate computes for it,
 * tried on one under the signer's next nonce that it keeps nowhere (Devnet.probeUnsigned). The
 * anvil shipped does; one configured by `chain.anvilPath` that hashes otherwise gets signed
 * records, as an external chain does, since a record's stored hash is how its receipt is found.
 */
export async function unsignedHashesAgree(devnet: Devnet, key: FastSigner, info: ChainInfo, nonce: number, log: Logger): Promise<boolean> {
  const probe = new LedgerSigner(key).unsigned(
    { chainId: info.chainId, ledger: info.ledger, maxFeePerGas: 50_000_000_000n, maxPriorityFeePerGas: 1n },
    { id: ZERO32, parentTxHash: ZERO32, agentId: 'probe', amount: 0n, protocol: 'probe', origin: 'http://probe', pathHash: ZERO32, depth: 0 },
    BigInt(nonce),
  )
  const got = await devnet.probeUnsigned(key.address, probe.raw).catch((e: unknown) => `refused (${(e as Error).message})`)
  if (got.toLowerCase() === probe.hash) return true
  log.warn({ expected: probe.hash, got }, 'the embedded chain hashes unsigned transactions otherwise than Paygate expects: ledger records are signed instead')
  return false
}

/** The configured signer, else one generated once and stored encrypted under the master key. */
async function loadKey(configured: Hex | null, meta: Collection<unknown>, keystore: Keystore, name: string): Promise<Hex> {
  if (configured) return configured
  const context = `${SIGNER_CONTEXT}:${name}`
  const stored = (await meta.get(name)) as string | undefined
  if (stored) return `0x${keystore.decrypt(stored, context).toString('hex')}`
  const pk = generatePrivateKey()
  await meta.put(name, keystore.encrypt(Buffer.from(pk.slice(2), 'hex'), context))
  return pk
}

async function loadSigner(configured: Hex | null, meta: Collection<unknown>, keystore: Keystore, name = 'signerKey'): Promise<PrivateKeyAccount> {
  return privateKeyToAccount(await loadKey(configured, meta, keystore, name))
}

async function setNativeBalance(client: PublicClient, address: Address, wei: bigint): Promise<void> {
  await client.request({ method: 'anvil_setBalance' as never, params: [address, `0x${wei.toString(16)}`] as never })
}

/** Deploy token and ledger once per embedded chain; reuse the stored addresses afterwards. */
async function embeddedDeployment(
  publicClient: PublicClient,
  walletClient: WalletClient,
  signer: PrivateKeyAccount,
  tokenOwner: Address,
  meta: Collection<unknown>,
  chainId: number,
  log: Logger,
): Promise<Deployment> {
  const key = `deployment:${chainId}`
  const stored = (await meta.get(key)) as Deployment | undefined
  if (stored) {
    const code = await publicClient.getCode({ address: stored.token })
    if (code && code !== '0x') return stored
    log.warn({ token: stored.token }, 'stored contract addresses have no code on the embedded chain (chain state lost?): deploying again')
  }
  const d = await deployContracts(publicClient, walletClient, signer, { token: true, tokenOwner })
  const dep: Deployment = { token: d.token!, ledger: d.ledger, deployedAt: new Date().toISOString() }
  await meta.put(key, dep)
  log.info({ token: dep.token, ledger: dep.ledger }, 'deployed token and ledger on the embedded chain')
  return dep
}

/** Deploy the ledger (and optionally the dev token) with `signer` as owner and recorder. */
export async function deployContracts(
  publicClient: PublicClient,
  walletClient: WalletClient,
  signer: PrivateKeyAccount,
  opts: { token: boolean; tokenOwner?: Address },
): Promise<{ token?: Address; ledger: Address }> {
  const deploy = async (abi: typeof paygateUsdcAbi | typeof paymentLedgerAbi, bytecode: Hex, args: readonly unknown[]): Promise<Address> => {
    const hash = await walletClient.deployContract({ abi, bytecode, args, account: signer, chain: walletClient.chain } as never)
    const receipt = await publicClient.waitForTransactionReceipt({ hash, timeout: 120_000 })
    if (receipt.status !== 'success' || !receipt.contractAddress) throw new PaygateError('internal_error', `deployment ${hash} failed`)
    return getAddress(receipt.contractAddress)
  }
  const token = opts.token ? await deploy(paygateUsdcAbi, bytecodes.PaygateUSDC, [opts.tokenOwner ?? signer.address]) : undefined
  const ledger = await deploy(paymentLedgerAbi, bytecodes.PaymentLedger, [])
  return { ...(token ? { token } : {}), ledger }
}

/**
 * `paygate deploy-ledger`: deploy a PaymentLedger (and, with `token`, a dev USDC token) on
 * the external chain named by chain.rpcUrl. The deployer is the service signer (configured,
 * or the one stored encrypted in this data directory), so it owns the ledger and records.
 */
export async function deployExternal(
  config: Config,
  deps: { meta: Collection<unknown>; keystore: Keystore },
  opts: { token: boolean },
): Promise<{ ledger: Address; token?: Address; signer: Address; chainId: number }> {
  const c = config.chain
  if (!c.rpcUrl) throw new PaygateError('invalid_config', 'deploy-ledger needs chain.rpcUrl (PAYGATE_CHAIN_RPC_URL): the embedded chain deploys its own contracts')
  const transport = transportFor(c.rpcUrl)
  const chain = viemChain(c.chainId, c.network ?? networkNameFor(c.chainId), c.rpcUrl)
  const publicClient = createPublicClient({ chain, transport, pollingInterval: 250 }) as PublicClient
  const reported = await publicClient.getChainId()
  if (reported !== c.chainId) throw new PaygateError('invalid_config', `chain.chainId = ${c.chainId} but the chain at ${shownUrl(c.rpcUrl)} reports ${reported}`)
  const signer = await loadSigner(c.signerKey, deps.meta, deps.keystore)
  const walletClient = createWalletClient({ chain, transport, account: signer, pollingInterval: 250 })
  const d = await deployContracts(publicClient, walletClient, signer, opts)
  return { ...d, signer: signer.address, chainId: c.chainId }
}

/** Faucet amounts from config (decimal strings) in base units: USDC 6 decimals, gas 18. */
export const faucetAmounts = (f: Config['faucet']): { usdc: bigint; gasWei: bigint } => ({
  usdc: parseDecimal(f.usdc, 6),
  gasWei: parseDecimal(f.gasEth, 18),
})
