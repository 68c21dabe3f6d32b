interface Node<K, V> {
  key: K
  value: V
  /** Toward the newest entry, and toward the oldest. */
  newer: Node<K, V> | null
  older: Node<K, V> | null
}

/**
 * A bounded map that drops its least recently used entry when full. The order is a linked list
 * beside the map, so a hit moves pointers only: re-inserting into the Map on every hit (its own
 * insertion order) left a deleted slot each time, and the table was rebuilt every few hundred
 * hits, a few percent of the paid path's main thread (docs/benchmarks.md).
 */
export class Lru<K, V> {
  private readonly map = new Map<K, Node<K, V>>()
  private newest: Node<K, V> | null = null
  private oldest: Node<K, V> | null = null

  constructor(private readonly max: number) {}

  get(key: K): V | undefined {
    // The newest entry first, by comparison: most uses repeat the last key, and a long string
    // read fresh off a socket is compared far faster than it is hashed for the Map.
    const top = this.newest
    if (top !== null && top.key === key) return top.value
    const n = this.map.get(key)
    if (n === undefined) return undefined
    if (n !== this.newest) {
      this.unlink(n)
      this.pushNewest(n)
    }
    return n.value
  }

  set(key: K, value: V): void {
    const had = this.map.get(key)
    if (had !== undefined) {
      had.value = value
      if (had !== this.newest) {
        this.unlink(had)
        this.pushNewest(had)
      }
      return
    }
    const n: Node<K, V> = { key, value, newer: null, older: null }
    this.map.set(key, n)
    this.pushNewest(n)
    if (this.map.size > this.max) {
      const old = this.oldest!
      this.unlink(old)
      this.map.delete(old.key)
    }
  }

  get size(): number {
    return this.map.size
  }

  private unlink(n: Node<K, V>): void {
    if (n.newer) n.newer.older = n.older
    else this.newest = n.older
    if (n.older) n.older.newer = n.newer
    else this.oldest = n.newer
    n.newer = n.older = null
  }

  private pushNewest(n: Node<K, V>): void {
    n.older = this.newest
    if (this.newest) this.newest.newer = n
    this.newest = n
    if (!this.oldest) this.oldest = n
  }
}

/**
 * `fn` of a string, remembered for the last `max` distinct arguments (a throw is not): for
 * pure functions the paid path calls per payment, such as parses of the few URLs agents pay
 * (a WHATWG URL parse costs a few µs each time).
 */
export function remembered<V>(fn: (s: string) => V, max = 1024): (s: string) => V {
  const seen = new Lru<string, V>(max)
  return (s) => {
    let v = seen.get(s)
    if (v === undefined) {
      v = fn(s)
      seen.set(s, v)
    }
    return v
  }
}

/** Freeze a value and everything reachable from it (plain data: JSON, arrays, offers). */
export function deepFreeze<T>(value: T, seen = new WeakSet<object>()): T {
  if (typeof value === 'object' && value !== null && !seen.has(value)) {
    seen.add(value)
    Object.freeze(value)
    for (const v of Object.values(value)) deepFreeze(v, seen)
  }
  return value
}
