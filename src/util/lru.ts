/** A bounded map that drops its least recently used entry when full. */
export class Lru<K, V> {
  private readonly map = new Map<K, V>()

  constructor(private readonly max: number) {}

  get(key: K): V | undefined {
    const v = this.map.get(key)
    if (v !== undefined) {
      // Map keeps insertion order: re-inserting marks the entry as the newest.
      this.map.delete(key)
      this.map.set(key, v)
    }
    return v
  }

  set(key: K, value: V): void {
    this.map.delete(key)
    this.map.set(key, value)
    if (this.map.size > this.max) this.map.delete(this.map.keys().next().value as K)
  }

  get size(): number {
    return this.map.size
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
