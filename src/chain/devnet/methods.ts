import type { RpcResponse } from './types.js'

// Which JSON-RPC calls the front lets through as reads, journals as writes, or refuses.
const READ_ONLY = new Set([
  'eth_chainId',
  'eth_blockNumber',
  'eth_call',
  'eth_estimateGas',
  'eth_gasPrice',
  'eth_maxPriorityFeePerGas',
  'eth_feeHistory',
  'eth_blobBaseFee',
  'eth_accounts',
  'eth_syncing',
  'eth_mining',
  'eth_hashrate',
  'eth_coinbase',
  'eth_protocolVersion',
  'eth_sign',
  'eth_signTypedData',
  'eth_signTypedData_v4',
  'personal_sign',
  'eth_signTransaction',
  'eth_newFilter',
  'eth_newBlockFilter',
  'eth_newPendingTransactionFilter',
  'eth_uninstallFilter',
  'eth_createAccessList',
  'eth_pendingTransactions',
  'eth_simulateV1',
  'eth_fillTransaction',
  'anvil_nodeInfo',
  'anvil_metadata',
  'hardhat_metadata',
  'anvil_getGenesisTime',
  'anvil_getIntervalMining',
])
const READ_PREFIXES = ['eth_get', 'debug_', 'trace_', 'ots_', 'txpool_', 'net_', 'web3_', 'erigon_']
export const SENDS = new Set(['eth_sendRawTransaction', 'eth_sendTransaction'])
export const MINES = new Set(['evm_mine', 'anvil_mine', 'hardhat_mine'])
export const REFUSED = new Set([
  'anvil_reset',
  'hardhat_reset',
  'anvil_dumpState',
  'hardhat_dumpState',
  'anvil_loadState',
  'hardhat_loadState',
  'evm_setIntervalMining',
  'anvil_setIntervalMining',
  'anvil_setChainId',
  'anvil_setRpcUrl',
  'anvil_rollback',
  'anvil_reorg',
])
export const AUTOMINE_QUERIES = new Set(['hardhat_getAutomine', 'anvil_getAutomine'])
export const AUTOMINE_SETTERS = new Set(['evm_setAutomine', 'anvil_setAutomine'])
/** Reads that run against the newest block's time, each with the index of its block tag. */
const TIMED_READS = new Map<string, number>([
  ['eth_call', 1],
  ['eth_estimateGas', 1],
  ['eth_createAccessList', 1],
  ['eth_simulateV1', 1],
  ['eth_fillTransaction', 1],
  ['debug_traceCall', 1],
  ['eth_getBlockByNumber', 0],
])
/** Whether this read sees the newest block: a tag of latest or pending, or none where that means latest. */
export function readsNewestBlock(method: string, params: unknown[]): boolean {
  const at = TIMED_READS.get(method)
  if (at === undefined) return false
  const tag = params[at]
  return tag === 'latest' || tag === 'pending' || ((tag === undefined || tag === null) && method !== 'eth_getBlockByNumber')
}
/** The caller set the next block's timestamp: no block mined for chain time may take it. */
export const SET_NEXT_TIME = /^(evm|anvil|hardhat)_setNextBlockTimestamp$/

export const isReadOnly = (m: string): boolean => READ_ONLY.has(m) || READ_PREFIXES.some((p) => m.startsWith(p))
export const rpcError = (id: unknown, code: number, message: string): RpcResponse => ({ jsonrpc: '2.0', id, error: { code, message } })
/** anvil's answer under the caller's id. */
export const reply = (id: unknown, r: RpcResponse): RpcResponse => (r.error ? { jsonrpc: '2.0', id, error: r.error } : { jsonrpc: '2.0', id, result: r.result ?? null })
