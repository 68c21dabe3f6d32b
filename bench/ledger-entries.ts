import { keccak256, toHex } from 'viem'
import type { LedgerEntry } from '../src/chain/ledger-tx.js'

/** The i-th synthetic ledger record of the chain benchmarks (50 agents, 20 merchants, 1,000 paths). */
export const entryOf = (i: number): LedgerEntry => ({
  id: keccak256(toHex(`payment-${i}`)),
  parentTxHash: keccak256(toHex(`parent-${i}`)),
  agentId: `agent-${i % 50}`,
  amount: BigInt(10_000 + i),
  protocol: i % 2 ? 'x402' : 'mpp',
  origin: `https://merchant${i % 20}.example`,
  pathHash: keccak256(toHex(`/api/v1/items/${i % 1000}`)),
  depth: i % 4,
})
