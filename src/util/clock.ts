/** Every clock read goes through a Clock so windows and schedules are testable without sleeping. */
export interface Clock {
  now(): number
}

export const systemClock: Clock = { now: () => Date.now() }

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
