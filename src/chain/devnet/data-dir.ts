import * as fs from 'node:fs'
import * as path from 'node:path'
import { promisify } from 'node:util'
import * as zlib from 'node:zlib'
import { lockFile } from '../../util/file-lock.js'
import type { DevnetLog } from './types.js'

// The files of a data dir: chain.json, devnet.lock, anvil.pid, and per generation g a journal
// journal-<g>.ndjson and a snapshot snap-<g>/ (state.json, meta.json) of the chain as it was
// when that journal was started.

const gunzip = promisify(zlib.gunzip)

/**
 * The rules a new chain runs under (its data dir keeps them for good). Cancun, not Prague:
 * Prague's EIP-2935 keeps every parent hash in a ring of 8,191 storage slots that anvil
 * rehashes at each block, so an empty block cost ~11 ms of anvil CPU at 8k blocks instead of
 * ~0.7, and the ring tripled every dump and load (docs/devnet.md "At scale"). Paygate's
 * contracts are built for Paris; nothing here uses what Prague added.
 */
export const NEW_CHAIN_HARDFORK = 'cancun'

interface ChainMeta {
  format: 1
  engine: 'anvil'
  chainId: number
  genesisTime: number
  hardfork: string
}

export interface SnapshotMeta {
  /** chain-time offset (s) relative to the wall clock when the snapshot was taken */
  offset: number
  blocks: number
  at: string
  /** anvil's newest block at the last trim of old headers (absent in snapshots of older versions: 0) */
  trimmedAt?: number
}

/** What a start finds in the data dir. */
export interface Generations {
  /** the newest complete snapshot (0: none) */
  base: number
  /** the journals to replay, oldest first */
  journals: number[]
  /** the generation to write to */
  gen: number
  /** state.json of the base snapshot */
  loadState: string | undefined
  /** its size: loading it takes ~6 ms per MB */
  stateMb: number
  /** its chain-time offset */
  offset: number
  /** its trim point (`SnapshotMeta.trimmedAt`) */
  trimmedAt: number
}

/** data dirs open in this process */
const openDirs = new Set<string>()

export const journalPath = (dir: string, g: number): string => path.join(dir, `journal-${g}.ndjson`)

/** Locks `dir` for this process and reads (or writes) its chain.json; `unlock` releases both. */
export function openDataDir(dir: string, chainId: number, log: DevnetLog): { meta: ChainMeta; unlock: () => void } {
  fs.mkdirSync(dir, { recursive: true })
  // one owner per data dir: an OS file lock, released by the kernel when its holder dies
  if (openDirs.has(dir)) throw new Error(`embedded chain: ${dir} is already open in this process`)
  const lock = lockFile(path.join(dir, 'devnet.lock'), `embedded chain: ${dir}`)
  openDirs.add(dir)
  const unlock = (): void => {
    openDirs.delete(dir)
    lock.release()
  }
  if (!lock.kernel) log('flock(1) not found: the data dir lock falls back to a pid check', {}, 'warn')

  const metaFile = path.join(dir, 'chain.json')
  let meta: ChainMeta
  if (fs.existsSync(metaFile)) {
    meta = JSON.parse(fs.readFileSync(metaFile, 'utf8')) as ChainMeta
    if (meta.chainId !== chainId) {
      unlock()
      throw new Error(`embedded chain: ${dir} holds chain id ${meta.chainId}, not ${chainId} (use another data dir or the old chain id)`)
    }
  } else {
    meta = { format: 1, engine: 'anvil', chainId, genesisTime: Math.floor(Date.now() / 1000), hardfork: NEW_CHAIN_HARDFORK }
    fs.writeFileSync(`${metaFile}.tmp`, JSON.stringify(meta))
    fs.renameSync(`${metaFile}.tmp`, metaFile)
  }
  return { meta, unlock }
}

/**
 * Start from the newest complete snapshot and replay every journal from its generation on (a
 * snapshot whose files were still being written when we died leaves its journal behind: replay
 * it too). What is older, or unfinished, is removed.
 */
export function findGenerations(dir: string): Generations {
  const numbered = (re: RegExp): number[] =>
    fs
      .readdirSync(dir)
      .map((f) => re.exec(f))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => Number(m[1]))
  const base =
    numbered(/^snap-(\d+)$/)
      .filter((g) => fs.existsSync(path.join(dir, `snap-${g}`, 'meta.json')))
      .sort((a, b) => b - a)[0] ?? 0
  const journals = numbered(/^journal-(\d+)\.ndjson$/)
    .filter((g) => g >= base)
    .sort((a, b) => a - b)
  for (const f of fs.readdirSync(dir)) {
    const m = /^(snap|journal)-(\d+)(\.tmp|\.ndjson)?$/.exec(f)
    if (!m) continue
    const g = Number(m[2])
    if (m[3] === '.tmp' || (m[1] === 'snap' && g !== base) || (m[1] === 'journal' && g < base)) fs.rmSync(path.join(dir, f), { recursive: true, force: true })
  }
  const found: Generations = { base, journals, gen: Math.max(base, ...journals), loadState: undefined, stateMb: 0, offset: 0, trimmedAt: 0 }
  if (base > 0) {
    found.loadState = path.join(dir, `snap-${base}`, 'state.json')
    found.stateMb = fs.statSync(found.loadState).size / 2 ** 20
    const sm = JSON.parse(fs.readFileSync(path.join(dir, `snap-${base}`, 'meta.json'), 'utf8')) as SnapshotMeta
    found.offset = sm.offset
    found.trimmedAt = sm.trimmedAt ?? 0
  }
  return found
}

/**
 * zlib's one-shot gunzip still runs chunk by chunk (16 KB by default), each chunk a main-thread
 * callback, then concatenates them: ~150 ms of main thread per 40 MB of state. gzip's trailer
 * holds the uncompressed size (mod 2^32, of the last member): sized to it, the output is one
 * chunk. A wrong hint only means more chunks; it is capped so a corrupt trailer cannot ask for
 * gigabytes.
 */
function gunzipChunkSize(gz: Buffer): number {
  const size = gz.length >= 18 ? gz.readUInt32LE(gz.length - 4) : 0
  return Math.min(2 ** 30, Math.max(64 * 1024, size + 1))
}

/**
 * Writes snap-<g> from anvil's dump (hex of gzipped JSON, or the JSON), then removes older generations.
 * Returns the size of state.json in MB.
 */
export async function writeSnapshot(dir: string, g: number, state: string | Buffer, sm: SnapshotMeta): Promise<number> {
  const tmp = path.join(dir, `snap-${g}.tmp`)
  fs.rmSync(tmp, { recursive: true, force: true })
  fs.mkdirSync(tmp)
  // One-shot gunzip and write run in the libuv threadpool; a stream pipeline costs main-thread
  // callbacks per chunk, which competes with the paid path under load.
  let json: Buffer
  if (typeof state === 'string') {
    const gz = Buffer.from(state.slice(2), 'hex')
    json = await gunzip(gz, { chunkSize: gunzipChunkSize(gz) })
  } else json = state
  await fs.promises.writeFile(path.join(tmp, 'state.json'), json)
  fs.writeFileSync(path.join(tmp, 'meta.json'), JSON.stringify(sm))
  fs.renameSync(tmp, path.join(dir, `snap-${g}`)) // commit point
  for (const f of fs.readdirSync(dir)) {
    const m = /^(snap|journal)-(\d+)(\.ndjson)?$/.exec(f)
    if (m && Number(m[2]) < g) fs.rmSync(path.join(dir, f), { recursive: true, force: true })
  }
  return json.length / 2 ** 20
}
