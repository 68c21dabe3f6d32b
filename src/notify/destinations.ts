import type { Channel } from './model.js'

/**
 * Attempts in flight at once to one destination: a receiver that hangs holds at most this
 * many of the queue's `concurrency` slots (each for up to notify.timeoutMs), so the deliveries
 * of every other destination keep going while its own wait their turn.
 */
export const PER_DESTINATION = 2

/** Where an attempt goes, as far as a hang is shared: a URL's origin; every e-mail goes through the one SMTP server. */
export function destinationOf(c: Channel): string {
  if (c.type === 'email') return 'smtp'
  try {
    return new URL(c.url).origin
  } catch {
    return c.url
  }
}

/** Attempts in flight per destination, at most `perDestination` each. */
export class DestinationSlots {
  private readonly busy = new Map<string, number>()

  constructor(private readonly perDestination: number) {}

  /** Take one of `dest`'s slots; false when all are taken. */
  claim(dest: string): boolean {
    const n = this.busy.get(dest) ?? 0
    if (n >= this.perDestination) return false
    this.busy.set(dest, n + 1)
    return true
  }

  release(dest: string): void {
    const n = (this.busy.get(dest) ?? 1) - 1
    if (n > 0) this.busy.set(dest, n)
    else this.busy.delete(dest)
  }
}
