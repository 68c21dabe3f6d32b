import { spawnSync } from 'node:child_process'
import fs from 'node:fs'

export interface FileLock {
  /** Whether the kernel holds the lock (flock); false: only the pid check of the fallback. */
  readonly kernel: boolean
  release(): void
}

/** flock(1)'s exit code when another process holds the lock (--conflict-exit-code). */
const CONFLICT = 75

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM'
  }
}

const holderOf = (file: string): string => {
  try {
    return fs.readFileSync(file, 'utf8').trim() || 'unknown'
  } catch {
    return 'unknown'
  }
}

/**
 * An exclusive lock on `file` for this process, with flock(2) semantics: the kernel releases
 * it when the process ends in any way (SIGKILL included), so a lock left by a dead holder, or
 * a file naming an unrelated process that reused its pid, never blocks. Node has no flock():
 * util-linux `flock(1)` takes it on our open file description, inherited as its fd 3, and
 * exits; the lock stays with the description, which only this process holds (Node opens files
 * close-on-exec, so children such as anvil do not inherit it) until `release` or exit. The
 * file keeps the holder's pid, for the message another process gets.
 *
 * Without `flock(1)` (not Linux), the old check: refused while the pid in the file is alive.
 */
export function lockFile(file: string, what: string): FileLock {
  const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600)
  const r = spawnSync('flock', ['--nonblock', '--conflict-exit-code', String(CONFLICT), '3'], { stdio: ['ignore', 'ignore', 'pipe', fd], timeout: 10_000 })
  const missing = (r.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT'
  if (!missing && r.status !== 0) {
    fs.closeSync(fd)
    if (r.status === CONFLICT) throw new Error(`${what} is in use by another process (held by pid ${holderOf(file)})`)
    throw new Error(`${what}: cannot lock ${file}: ${r.error?.message || r.stderr.toString().trim() || `flock exited ${r.status}`}`)
  }
  if (missing) {
    const holder = Number(holderOf(file))
    if (holder && holder !== process.pid && pidAlive(holder)) {
      fs.closeSync(fd)
      throw new Error(`${what} is in use by another process (held by pid ${holder})`)
    }
  }
  fs.ftruncateSync(fd, 0)
  fs.writeSync(fd, String(process.pid), 0)
  let held = true
  return {
    kernel: !missing,
    release() {
      if (!held) return
      held = false
      // The file stays: removing it would let a process that opened it just before lock a
      // file no one else can find any more, while a third creates and locks a new one.
      fs.ftruncateSync(fd, 0)
      fs.closeSync(fd)
    },
  }
}
