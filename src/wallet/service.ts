import type { Chain } from '../chain/chain.js'
import type { Logger } from '../log/index.js'
import { usdc } from '../util/money.js'
import type { WalletRecord, Wallets } from './wallets.js'

export interface WalletView {
  address: string
  network: string
  balance?: { usdc: number }
}

/** Wallets as the API shows them: the stored key pair plus the chain's view of it. */
export class WalletService {
  constructor(
    readonly wallets: Wallets,
    private readonly chain: Chain,
    private readonly faucetAmounts: { usdc: bigint; gasWei: bigint },
    private readonly log: Logger,
  ) {}

  /** Create the agent's wallet; on the embedded chain the dev faucet funds it. */
  async create(agentId: string, opts: { createAgent?: boolean } = {}): Promise<WalletView> {
    const w = await this.wallets.create(agentId, opts)
    if (this.chain.embedded) {
      try {
        await this.chain.faucet(w.address, this.faucetAmounts.usdc, this.faucetAmounts.gasWei)
      } catch (e) {
        // The wallet exists either way; a failed dev top-up can be repeated with the faucet endpoint.
        this.log.error({ err: e, agentId, address: w.address }, 'dev faucet could not fund the new wallet')
      }
    }
    return { address: w.address, network: this.chain.info.network }
  }

  async view(agentId: string): Promise<WalletView> {
    const w: WalletRecord = await this.wallets.require(agentId)
    const balance = await this.chain.balanceOf(w.address)
    return { address: w.address, network: this.chain.info.network, balance: usdc(balance) }
  }

  /** Dev faucet top-up (embedded chain only; 403 elsewhere). */
  async faucet(agentId: string, usdcUnits: bigint | null): Promise<WalletView & { funded: { usdc: number } }> {
    const w = await this.wallets.require(agentId)
    const amount = usdcUnits ?? this.faucetAmounts.usdc
    await this.chain.faucet(w.address, amount, 0n)
    return { ...(await this.view(agentId)), funded: usdc(amount) }
  }
}
