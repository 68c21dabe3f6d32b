import { parentPort, workerData } from 'node:worker_threads'
import { startDevnet } from './index.js'
import type { Devnet, DevnetOptions } from './types.js'
import { errorOf, type Call, type FromThread } from './thread.js'

/** The embedded chain's thread (see thread.ts): runs startDevnet and answers the main thread's calls. */
const port = parentPort!
const post = (m: FromThread): void => port.postMessage(m)
const STATS_MS = 1000

let devnet: Devnet | undefined
try {
  devnet = await startDevnet({ ...(workerData as Omit<DevnetOptions, 'log'>), log: (msg, fields, level) => post({ t: 'log', msg, fields, level }) })
  post({ t: 'ready', rpcUrl: devnet.rpcUrl, chainId: devnet.chainId, childPid: devnet.childPid, stats: devnet.stats() })
} catch (e) {
  post({ t: 'failed', error: errorOf(e) })
  process.exit(0)
}
const d = devnet!
const stats = setInterval(() => post({ t: 'stats', stats: d.stats() }), STATS_MS)

const run = (c: Call): Promise<unknown> => {
  switch (c.op) {
    case 'request':
      return d.request(c.arg)
    case 'send':
      return d.sendRawTransactions(c.arg)
    case 'sendLedger':
      return d.sendLedger(c.arg.from, c.arg.raws)
    case 'probeUnsigned':
      return d.probeUnsigned(c.arg.from, c.arg.raw)
    case 'snapshot':
      return d.snapshot()
    case 'close':
      clearInterval(stats)
      return d.close()
  }
}

port.on('message', (c: Call) => {
  run(c)
    .then(
      (value) => post({ t: 'reply', id: c.id, value, stats: c.op === 'request' ? undefined : d.stats() }),
      (e: unknown) => post({ t: 'reply', id: c.id, error: errorOf(e) }),
    )
    .finally(() => {
      // Closed, well or not: the thread ends (exit: tsx's loader, when run from source, keeps a port of its own open).
      if (c.op === 'close') process.exit(0)
    })
})
