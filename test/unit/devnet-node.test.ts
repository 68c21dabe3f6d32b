import t from 'tap'
import type { IpcClient } from '../../src/chain/devnet/ipc.js'
import { AnvilNode } from '../../src/chain/devnet/node.js'

/**
 * The serial queue and sends beside a dump: a send made while a snapshot waits in the queue
 * (behind a block, say) goes beside its dump once the dump begins, instead of queueing behind
 * the whole snapshot; if the snapshot's turn comes without a dump, it goes on the queue.
 */
function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void
  const promise = new Promise<void>((r) => {
    resolve = r
  })
  return { promise, resolve }
}

/** A node whose serial queue is held by a block until `block.resolve()`; `events` says what ran, in order. */
function held() {
  const n = new AnvilNode({} as IpcClient, () => {})
  const events: string[] = []
  const block = deferred()
  void n.serial(async () => {
    await block.promise
    events.push('block mined')
  })
  /** A send that records whether it went beside a dump, and resolves that. */
  const send = (): Promise<boolean> =>
    n.send(async (beside) => {
      events.push(`send (beside: ${beside})`)
      return beside
    })
  return { n, events, block, send }
}

t.test('a send made while a snapshot is queued goes beside its dump, while the dump still runs', async (t) => {
  const { n, events, block, send } = held()
  const dump = deferred()
  n.dumpQueued()
  const snapshot = n.serial(() =>
    n.beside(async () => {
      events.push('dump begun')
      await dump.promise
      events.push('dump done')
    }),
  )
  const sent = send()
  block.resolve()
  const ends = setTimeout(dump.resolve, 500) // (a send queued behind the snapshot would wait for this)
  t.equal(await sent, true, 'the send went beside the dump')
  t.same(events, ['block mined', 'dump begun', 'send (beside: true)'], 'answered before the dump ended')
  clearTimeout(ends)
  dump.resolve()
  await snapshot
  t.same(events.slice(-1), ['dump done'])
  t.equal(n.sentBesideDumps, 1)
})

t.test("a snapshot's turn without a dump lets the waiting sends onto the queue", async (t) => {
  const { n, events, block, send } = held()
  n.dumpQueued()
  void n.serial(async () => {
    events.push('snapshot not needed')
    n.dumpBegun()
  })
  const sent = send()
  block.resolve()
  t.equal(await sent, false)
  t.same(events, ['block mined', 'snapshot not needed', 'send (beside: false)'])
  t.equal(n.sentBesideDumps, 0)
})

t.test('with no snapshot queued a send waits its turn on the queue', async (t) => {
  const { events, block, send } = held()
  const sent = send()
  block.resolve()
  t.equal(await sent, false)
  t.same(events, ['block mined', 'send (beside: false)'])
})
