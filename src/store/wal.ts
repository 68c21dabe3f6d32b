import * as fs from 'node:fs'
import { basename, join } from 'node:path'
import { crc32 } from 'node:zlib'

/**
 * The store's write-ahead log: a batch is durable once its record is appended here with one
 * `writeSync` (~4 us for 1 KB), the same guarantee LevelDB gives by default (the OS has the
 * bytes; a process crash loses nothing, a power cut may). LevelDB is written behind it.
 *
 * Files `<dir>/<n>.log`, each a sequence of records: u32 LE payload length, u32 LE crc32 of
 * the payload, then the payload: a format byte 1, then per op a kind byte (1 put, 0 delete),
 * the key (u32 LE byte length, UTF-8) and for a put the value (the same). Keys are full
 * LevelDB keys, values their encoded JSON. Logs written before this format hold JSON
 * payloads (`[[key, value]...]`, `[key]` for a delete), which start with `[`, and are read
 * as such. Binary, because a JSON payload escapes every quote of the JSON values inside it:
 * encoding it cost as much as encoding the values. A file past `maxBytes` is closed and a
 * new one started; the store removes a closed file once everything in it is in LevelDB.
 */
/** `fresh`: in memory only, never logged (see `BatchOp`). */
export type WalOp = [key: string, value?: string, fresh?: true]

const HEADER = 8
const BINARY = 1
/** What one string may take in UTF-8, at most, per UTF-16 code unit. */
const UTF8_MAX = 3

/** A record's payload back into its ops (either format). */
function decode(payload: Buffer): WalOp[] {
  if (payload[0] !== BINARY) return JSON.parse(payload.toString('utf8')) as WalOp[]
  const ops: WalOp[] = []
  let at = 1
  const str = (): string => {
    const len = payload.readUInt32LE(at)
    at += 4 + len
    return payload.toString('utf8', at - len, at)
  }
  while (at < payload.length) {
    const put = payload[at++] === 1
    const key = str()
    ops.push(put ? [key, str()] : [key])
  }
  return ops
}

/** Write `s` as u32 LE byte length then UTF-8 at `at` (room checked by the caller); returns the next offset. */
function putString(out: Buffer, at: number, s: string): number {
  const len = out.write(s, at + 4, 'utf8')
  out.writeUInt32LE(len, at)
  return at + 4 + len
}

/** Records (header and binary payload) of `batches`, one per batch, in one buffer: `scratch` when it has room, else a new one. */
function encodeRecords(batches: readonly (readonly WalOp[])[], scratch: Buffer): Buffer {
  let room = 0
  for (const ops of batches) {
    room += HEADER + 1
    for (const [key, value] of ops) room += 9 + UTF8_MAX * (key.length + (value?.length ?? 0))
  }
  const out = room <= scratch.length ? scratch : Buffer.allocUnsafe(room)
  let at = 0
  for (const ops of batches) {
    const start = at
    at += HEADER
    out[at++] = BINARY
    for (const [key, value] of ops) {
      out[at++] = value === undefined ? 0 : 1
      at = putString(out, at, key)
      if (value !== undefined) at = putString(out, at, value)
    }
    out.writeUInt32LE(at - start - HEADER, start)
    out.writeUInt32LE(crc32(out.subarray(start + HEADER, at)), start + 4)
  }
  return out.subarray(0, at)
}
/**
 * Appends encode into one buffer kept for the purpose (written synchronously, so free again at
 * once): a new buffer per append cost an allocation of three times the batch's size.
 */
const SCRATCH_BYTES = 2 ** 20

/** Log files are numbered in the order they were started: `000000000001.log`, ... */
const FILE_RE = /^(\d{12})\.log$/

export class Wal {
  private fd: number
  private size = 0
  private readonly scratch = Buffer.allocUnsafe(SCRATCH_BYTES)
  /** closed files, oldest first, with the last sequence number each holds */
  private readonly closed: { path: string; lastSeq: number }[] = []

  private constructor(
    private readonly dir: string,
    private readonly maxBytes: number,
    private n: number,
  ) {
    this.fd = fs.openSync(this.path(n), 'a', 0o600)
  }

  private path(n: number): string {
    return join(this.dir, `${String(n).padStart(12, '0')}.log`)
  }

  /**
   * Read every record left by the last run (oldest first), for replay into LevelDB; then
   * `start()` removes those files and opens a fresh one. A record cut short or failing its
   * checksum ends its file: only the tail of the file being written when the process died can
   * be incomplete, and that record was never acknowledged.
   */
  static recover(dir: string): { files: string[]; batches: WalOp[][]; torn: number } {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 })
    const files = fs
      .readdirSync(dir)
      .filter((f) => FILE_RE.test(f))
      .sort()
      .map((f) => join(dir, f))
    const batches: WalOp[][] = []
    let torn = 0
    for (const file of files) {
      const buf = fs.readFileSync(file)
      let at = 0
      while (at < buf.length) {
        if (at + HEADER > buf.length) break
        const len = buf.readUInt32LE(at)
        const end = at + HEADER + len
        if (end > buf.length) break
        const payload = buf.subarray(at + HEADER, end)
        if (crc32(payload) !== buf.readUInt32LE(at + 4)) break
        batches.push(decode(payload))
        at = end
      }
      if (at < buf.length) torn++
    }
    return { files, batches, torn }
  }

  /** Remove the replayed files (their contents are now in LevelDB) and open a new log after them. */
  static start(dir: string, replayed: string[], maxBytes: number): Wal {
    const last = replayed.length ? Number(FILE_RE.exec(basename(replayed[replayed.length - 1]!))![1]) : 0
    for (const f of replayed) fs.rmSync(f, { force: true })
    return new Wal(dir, maxBytes, last + 1)
  }

  /**
   * Append one record per batch, in one write. Throws if the write fails; the file is then
   * cut back to where it was, so no partial record sits before the next one.
   */
  append(batches: readonly (readonly WalOp[])[], lastSeq: number): void {
    const out = encodeRecords(batches, this.scratch)
    let written = 0
    try {
      while (written < out.length) written += fs.writeSync(this.fd, out, written)
    } catch (e) {
      try {
        fs.ftruncateSync(this.fd, this.size)
      } catch {
        /* the write error is the one to report */
      }
      throw e
    }
    this.size += out.length
    if (this.size >= this.maxBytes) this.rotate(lastSeq)
  }

  private rotate(lastSeq: number): void {
    fs.closeSync(this.fd)
    this.closed.push({ path: this.path(this.n), lastSeq })
    this.n++
    this.fd = fs.openSync(this.path(this.n), 'a', 0o600)
    this.size = 0
  }

  /** Remove the closed files whose records are all in LevelDB (sequence numbers up to `appliedSeq`). */
  retire(appliedSeq: number): void {
    while (this.closed.length && this.closed[0]!.lastSeq <= appliedSeq) fs.rmSync(this.closed.shift()!.path, { force: true })
  }

  /** Close the log; with `applied`, everything in it is in LevelDB and the files are removed. */
  close(applied: boolean): void {
    fs.closeSync(this.fd)
    if (!applied) return
    for (const c of this.closed.splice(0)) fs.rmSync(c.path, { force: true })
    fs.rmSync(this.path(this.n), { force: true })
  }
}
