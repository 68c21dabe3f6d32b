import type { Hex, PublicClient } from 'viem'
import { PaygateError } from '../errors/index.js'
import type { TokenDomain } from '../protocols/types.js'
import type { Address } from './chain.js'
import { paygateUsdcAbi } from './contracts/abis.js'
import { isUnanswered } from './rpc.js'

/** EIP-5267 `fields` of the only domain shape Paygate signs EIP-3009 over: name, version, chainId, verifyingContract. */
const SIGNABLE_DOMAIN_FIELDS = 0x0f

const firstLine = (e: unknown): string => String((e as Error)?.message ?? e).split('\n')[0]!

/**
 * The token's EIP-712 domain name and version, asked once at start: EIP-5267
 * `eip712Domain()` when the token has it, else `name()` and `version()` (Circle's
 * FiatToken has no EIP-5267; Base Sepolia USDC answers "USDC"/"2", Base USDC "USD
 * Coin"/"2"). Authorizations signed over any other domain revert at settlement, so a
 * token that answers neither, or whose domain has another shape, stops the start.
 */
export async function readTokenDomain(client: PublicClient, token: Address, chainId: number): Promise<TokenDomain> {
  const where = `chain.token = ${token}`
  let reported: readonly [Hex, string, string, bigint, Address, Hex, readonly bigint[]] | null = null
  try {
    reported = await client.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'eip712Domain' })
  } catch (e) {
    // No EIP-5267 (a revert or an unreadable answer): the token's name() and version() say it.
    // A node that does not answer says nothing about the token: that stops the start as it is.
    if (isUnanswered(e)) throw e
  }
  if (reported) {
    const [fields, name, version, domainChainId, verifyingContract] = reported
    if (Number(fields) !== SIGNABLE_DOMAIN_FIELDS || domainChainId !== BigInt(chainId) || verifyingContract.toLowerCase() !== token.toLowerCase()) {
      throw new PaygateError(
        'invalid_config',
        `${where}: its EIP-712 domain (fields ${fields}, chainId ${domainChainId}, verifyingContract ${verifyingContract}) is not {name, version, chainId ${chainId}, verifyingContract ${token}}: EIP-3009 authorizations cannot be signed for it`,
      )
    }
    return { name, version }
  }
  try {
    const [name, version] = await Promise.all([
      client.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'name' }),
      client.readContract({ address: token, abi: paygateUsdcAbi, functionName: 'version' }),
    ])
    return { name, version }
  } catch (e) {
    if (isUnanswered(e)) throw e
    throw new PaygateError(
      'invalid_config',
      `${where} answers neither eip712Domain() nor name() and version() on chain ${chainId}, so its EIP-712 domain is unknown: is it an EIP-3009 token? (${firstLine(e)})`,
    )
  }
}
