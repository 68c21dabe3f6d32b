import t from 'tap'
import { networkShown } from '../../src/chain/chain.js'

t.test("an offer's network in the API's one style", async (t) => {
  const devnet = { chainId: 31337, network: 'paygate-devnet' }
  t.equal(networkShown('eip155:31337', devnet), 'paygate-devnet', "CAIP-2 of the gateway's own chain: its name")
  t.equal(networkShown('eip155:8453', devnet), 'base-mainnet', 'a well-known id')
  t.equal(networkShown('eip155:777', devnet), 'evm-777', 'any other id')
  t.equal(networkShown('base-sepolia', devnet), 'base-sepolia', 'x402 v1 names are in that style already')
  t.equal(networkShown('base-sepolia', { chainId: 84532, network: 'paygate-devnet' }), 'paygate-devnet', "a v1 name of the gateway's own chain id: its name")
  t.equal(networkShown('solana', devnet), 'solana', 'anything else as offered')
})
