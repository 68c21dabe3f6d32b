// The embedded dev chain: anvil as a child process behind a journaling JSON-RPC front, so that
// acknowledged writes survive a SIGKILL of Paygate. Design and measured figures: docs/devnet.md.
import * as fs from 'node:fs'
import type * as http from 'node:http'
import * as path from 'node:path'
import { ReceiptArchive } from './archive.js'
import { anvilArgs, anvilBinary, type Child, exitSignal, killStaleAnvil, processCpuMs, spawnAnvil, stopAnvil } from './anvil.js'
import { findGenerations, type Generations, openDataDir } from './data-dir.js'
import { Journal } from './journal.js'
import { Miner } from './miner.js'
import { AnvilNode } from './node.js'
import { type Restored, restore } from './replay.js'
import { RpcFront } from './rpc.js'
import { serveHttp } from './http.js'
import { TRIM_EVERY_BLOCKS, TRIM_KEEP_HEADERS } from './trim.js'
import { type Devnet, type DevnetLog, type DevnetOptions, DevnetUnavailableError } from './types.js'

export { DEVNET_MNEMONIC, type Devnet, type DevnetOptions, type DevnetStats, DevnetUnavailableError, type SendResult } from './types.js'

export async function startDevnet(opts: DevnetOptions): Promise<Devnet> {
  const log = opts.log ?? ((): void => {})
  const ipcTimeoutMs = opts.ipcTimeoutMs ?? 30_000
  const keepBlocks = Math.max(2, opts.keepBlocks ?? 2)
  const dir = path.resolve(opts.dataDir)
  const { meta, unlock } = openDataDir(dir, opts.chainId, log)
  const pidFile = path.join(dir, 'anvil.pid')
  let gens: Generations
  let child: Child
  let loadMs: number
  try {
    killStaleAnvil(pidFile, dir, log)
    gens = findGenerations(dir)
    const args = anvilArgs(opts.chainId, meta.genesisTime, meta.hardfork, gens.loadState, keepBlocks)
    const t = performance.now()
    child = await spawnAnvil(anvilBinary(opts.anvilPath), args, dir, pidFile, ipcTimeoutMs, log)
    loadMs = performance.now() - t
  } catch (e) {
    unlock()
    throw e
  }

  const node = new AnvilNode(child.ipc, log, child.ipcPath, ipcTimeoutMs)
  const archive = new ReceiptArchive(path.join(dir, 'receipts'), keepBlocks)
  let miner: Miner | undefined
  try {
    const restored = await restore(node, archive, dir, gens, log)
    const journal = new Journal(
      {
        dir,
        restartBudgetMs: opts.restartBudgetMs ?? 2000,
        trimEveryBlocks: Math.max(TRIM_KEEP_HEADERS, opts.trimEveryBlocks ?? TRIM_EVERY_BLOCKS),
        dumpTimeoutMs: 4 * ipcTimeoutMs,
        log,
        anvilCpuMs: () => processCpuMs(child.anvilPid),
      },
      restored.journal,
    )
    const blockTimeMs = opts.blockTimeMs ?? 250
    miner = new Miner(node, journal, archive, { blockTimeMs, idleSnapshotMs: opts.idleSnapshotMs ?? 2000, freshBlockMs: opts.freshBlockMs ?? 2000, log })
    miner.start()
    const front = new RpcFront(node, journal, miner, archive, blockTimeMs)
    const { server, rpcUrl } = await serveHttp((req) => front.handle(req), opts.host, opts.port)
    const { replayed, replayMs } = restored
    log('embedded chain ready', {
      rpcUrl,
      chainId: opts.chainId,
      anvilPid: child.anvilPid,
      generation: journal.gen,
      blocks: node.blocks,
      replayed,
      loadMs: Math.round(loadMs),
      replayMs: Math.round(replayMs),
    })
    const parts: Parts = { node, journal, miner, archive, child, server, log, pidFile, unlock }
    watchAnvil(parts)
    return handleOf(parts, front, rpcUrl, opts.chainId, restored, loadMs)
  } catch (e) {
    node.closed = true
    miner?.stop()
    archive.close()
    await stopAnvil(child)
    unlock()
    throw e
  }
}

interface Parts {
  node: AnvilNode
  journal: Journal
  miner: Miner
  archive: ReceiptArchive
  child: Child
  server: http.Server
  log: DevnetLog
  pidFile: string
  unlock: () => void
}

/** If anvil dies under us, say so loudly, and fail every call at once from then on. */
function watchAnvil({ node, miner, child, log }: Parts): void {
  child.proc.once('exit', (code, signal) => {
    if (node.closed) return
    const killedBy = exitSignal(code, signal)
    node.fail(new DevnetUnavailableError(`embedded chain: anvil exited unexpectedly (${killedBy ?? `code ${code}`}); restart Paygate`))
    log('anvil exited unexpectedly', { code: killedBy ? null : code, signal: killedBy, stderr: child.stderrTail().slice(-500) }, 'error')
    miner.stop()
    node.wakeAll()
  })
}

function handleOf(parts: Parts, front: RpcFront, rpcUrl: string, chainId: number, restored: Restored, loadMs: number): Devnet {
  const { node, journal, miner } = parts
  const { replayed, replayMs } = restored
  let closing: Promise<void> | undefined
  return {
    rpcUrl,
    chainId,
    childPid: parts.child.anvilPid,
    request: (a) => front.request(a),
    sendRawTransactions: (raws) => front.sendRawTransactions(raws),
    sendLedger: (from, raws) => front.sendLedger(from, raws),
    probeUnsigned: (from, raw) => front.probeUnsigned(from, raw),
    stats: () => ({
      blocks: node.blocks,
      generation: journal.gen,
      tailEntries: journal.tail.entries,
      replayed,
      replayMs,
      loadMs,
      mineMs: Math.round(miner.mineMs * 10) / 10,
      snapshotMs: [...journal.snapshotMs],
      snapshots: journal.snapshots,
      snapshotCpuMs: [...journal.snapshotCpuMs],
      sentBesideDumps: node.sentBesideDumps,
      trims: journal.trims,
      dumping: node.dumping,
    }),
    snapshot: async () => {
      await node.serial(() => miner.snapshot())
      await journal.written()
    },
    close: () => (closing ??= close(parts)),
  }
}

async function close({ node, journal, miner, archive, child, server, log, pidFile, unlock }: Parts): Promise<void> {
  miner.stop()
  await node
    .serial(async () => {
      if (journal.closeSnapshotWorthIt() && !node.dead) await miner.snapshot()
      node.closed = true
    })
    .catch((e: unknown) => {
      node.closed = true
      log('final snapshot failed (the journal still holds everything)', { error: String(e) }, 'warn')
    })
  await journal.written()
  node.wakeAll()
  server.closeAllConnections()
  await new Promise<void>((r) => server.close(() => r()))
  journal.close()
  archive.close()
  node.closeDumpIpc()
  await stopAnvil(child)
  fs.rmSync(pidFile, { force: true })
  unlock()
}
