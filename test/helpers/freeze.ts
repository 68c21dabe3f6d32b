import { readdirSync, readFileSync } from 'node:fs'

/** Whether a process exists (signal 0 reaches it). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/**
 * SIGSTOP a process, then wait until every thread of it has stopped: a group stop is not instant
 * on a busy box, and a thread still running may answer one more request.
 */
export async function freeze(pid: number): Promise<void> {
  process.kill(pid, 'SIGSTOP')
  const state = (task: string): string => readFileSync(`/proc/${pid}/task/${task}/stat`, 'utf8').split(') ')[1]![0]!
  const end = Date.now() + 5000
  while (Date.now() < end && !readdirSync(`/proc/${pid}/task`).every((task) => state(task) === 'T')) await new Promise((r) => setTimeout(r, 5))
}
