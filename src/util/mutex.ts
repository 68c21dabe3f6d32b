/**
 * Serialises async work per key (e.g. per agent) inside this process, so that
 * read-modify-write sequences on LevelDB never interleave for the same key.
 */
export class KeyedMutex {
  private tails = new Map<string, Promise<void>>()

  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve()
    let release!: () => void
    const mine = new Promise<void>((r) => (release = r))
    const tail = prev.then(() => mine)
    this.tails.set(key, tail)
    await prev
    try {
      return await fn()
    } finally {
      release()
      if (this.tails.get(key) === tail) this.tails.delete(key)
    }
  }

  /** Wait for `key`, then hold it until the returned release is called (for a hold that outlives one callback). */
  acquire(key: string): Promise<() => void> {
    return new Promise((acquired) => {
      this.run(key, () => new Promise<void>((release) => acquired(release))).catch(() => {})
    })
  }
}
