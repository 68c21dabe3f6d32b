import t from 'tap'
import { journalLine } from '../../src/chain/devnet/journal.js'
import type { AnvilNode } from '../../src/chain/devnet/node.js'
import { type ResentRun, resendPool } from '../../src/chain/devnet/trim.js'
import type { RpcResponse } from '../../src/chain/devnet/types.js'

/**
 * How a trim sends anvil's pool again (resendPool): in the order first sent, one impersonated
 * sender's txs pipelined up to the next block, a block after every 32, each run journalled
 * before it goes; and when anvil refuses one, every tx not yet journalled is journalled before
 * the error, so a restart still has them all. (The same against anvil: test/integration/devnet-trim.test.ts.)
 */
const LEDGER = '0x00000000000000000000000000000000000000aa'
/** 40 unsigned ledger txs (sent as LEDGER impersonated), then 30 signed raw ones. */
const lines = [
  ...Array.from({ length: 40 }, (_, i) => journalLine('eth_sendTransaction', JSON.stringify([{ nonce: i }]), LEDGER)),
  ...Array.from({ length: 30 }, (_, i) => journalLine('eth_sendRawTransaction', JSON.stringify([`0x${i}`]))),
]

/** An anvil stand-in: records every call in order ("mine" for a block); refuses the call whose params are `refuse`. */
function standIn(refuse?: string) {
  const calls: string[] = []
  const answer = (p: string): RpcResponse => (p === refuse ? { jsonrpc: '2.0', id: 1, error: { code: -32000, message: 'nonce too low' } } : { jsonrpc: '2.0', id: 1, result: '0x01' })
  const node = {
    forgetImpersonated() {},
    async impersonate() {},
    ipc: {
      async call(_m: string, p: string) {
        calls.push(p)
        return answer(p)
      },
      async callMany(_m: string, ps: string[]) {
        calls.push(...ps)
        return ps.map(answer)
      },
    },
  } as unknown as AnvilNode
  const journal: ResentRun[] = []
  const blocks = {
    txs: 32,
    mine: async () => {
      calls.push('mine')
    },
  }
  return { node, calls, journal, blocks }
}

const flat = (runs: ResentRun[]): string[] => runs.flatMap((r) => r.ps.map((p) => journalLine(r.m, p, r.as)))

t.test('the pool goes back in order, pipelined per impersonated sender, with a block after every 32', async (t) => {
  const s = standIn()
  t.equal(await resendPool(s.node, lines, (r) => s.journal.push(r), s.blocks), 70)
  t.same(flat(s.journal), lines, 'every tx journalled once, in the order first sent')
  t.same(
    s.journal.map((r) => r.ps.length),
    [32, 8, ...Array(30).fill(1)],
    'the ledger txs in two runs (cut at the block), the signed ones one at a time',
  )
  t.same(
    s.calls.map((c, i) => (c === 'mine' ? i : -1)).filter((i) => i >= 0),
    [32, 65],
    'a block after the 32nd and the 64th (the last 6 are left for the miner)',
  )
  t.same(
    s.calls.filter((c) => c !== 'mine'),
    lines.map((l) => JSON.stringify((JSON.parse(l) as { p: unknown }).p)),
  )
})

t.test('without blocks (the caller mines) they all go back with none between', async (t) => {
  const s = standIn()
  await resendPool(s.node, lines, (r) => s.journal.push(r))
  t.same(
    s.journal.map((r) => r.ps.length),
    [40, ...Array(30).fill(1)],
  )
  t.notOk(s.calls.includes('mine'))
})

t.test('a tx anvil refuses: the ones not yet sent are journalled before the error', async (t) => {
  const s = standIn(JSON.stringify([`0x${5}`])) // the 46th
  await t.rejects(
    resendPool(s.node, lines, (r) => s.journal.push(r), s.blocks),
    /refused after trimming old headers: nonce too low/,
  )
  t.same(flat(s.journal), lines, 'the journal still holds all 70, in order')
  t.equal(s.calls.filter((c) => c !== 'mine').length, 46, 'none sent after the refusal')
})
