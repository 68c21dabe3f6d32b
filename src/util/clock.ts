/** Every clock read goes through a Clock so windows and schedules are testable without sleeping. */
export interface Clock {
  now(): number
}

export const systemClock: Clock = { now: () => Date.now() }

/** Wall time plus an offset a test moves: windows and expiries without sleeping, while a chain keeps real time. */
export class OffsetClock implements Clock {
  offset = 0
  now(): number {
    return Date.now() + this.offset
  }
}

/** A clock tests move by hand. */
export class ManualClock implements Clock {
  constructor(private t = Date.parse('2026-01-01T00:00:00Z')) {}
  now(): number {
    return this.t
  }
  advance(ms: number): void {
    this.t += ms
  }
  set(t: number): void {
    this.t = t
  }
}
