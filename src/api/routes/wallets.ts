import type { Chain } from '../../chain/chain.js'
import { PaygateError, invalid } from '../../errors/index.js'
import { AmountError, parseDecimal } from '../../util/money.js'
import type { WalletService } from '../../wallet/service.js'
import { validateAgentId } from '../../agents/registry.js'
import { onlyFields } from '../http.js'
import { requireAgentAccess, type Route } from '../router.js'

const FAUCET_MAX_UNITS = 1_000_000n * 1_000_000n

/** Wallets (account-level; an agent key may read its own) and the chain description. */
export function walletRoutes(service: WalletService, chain: Chain): Route[] {
  return [
    {
      method: 'POST',
      path: '/v1/wallets',
      access: 'account',
      async handler(ctx) {
        const body = onlyFields(await ctx.body(), ['agentId'])
        if (body.agentId === undefined) throw invalid('agentId', 'agentId is required')
        return { status: 201, body: await service.create(validateAgentId(body.agentId), { createAgent: true }) }
      },
    },
    {
      method: 'GET',
      path: '/v1/wallets/:agentId',
      access: 'agent',
      async handler(ctx) {
        requireAgentAccess(ctx.identity, ctx.params.agentId!)
        return { status: 200, body: await service.view(ctx.params.agentId!) }
      },
    },
    {
      method: 'POST',
      path: '/v1/wallets/:agentId/faucet',
      access: 'account',
      async handler(ctx) {
        if (!chain.embedded) throw new PaygateError('forbidden', 'the dev faucet exists only on the embedded chain')
        const body = onlyFields(await ctx.body(), ['usdc'])
        let units: bigint | null = null
        if (body.usdc !== undefined) {
          try {
            units = parseDecimal(body.usdc as number | string)
          } catch (e) {
            throw invalid('usdc', `usdc ${e instanceof AmountError ? e.message : 'is not an amount'}`)
          }
          if (units <= 0n || units > FAUCET_MAX_UNITS) throw invalid('usdc', 'usdc must be positive and at most 1000000')
        }
        return { status: 200, body: await service.faucet(ctx.params.agentId!, units) }
      },
    },
    {
      method: 'GET',
      path: '/v1/chain',
      access: 'account',
      async handler() {
        return { status: 200, body: { ...chain.info, embedded: chain.embedded, blockNumber: Number(await chain.blockNumber()) } }
      },
    },
  ]
}
