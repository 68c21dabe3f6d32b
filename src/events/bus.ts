import { EventEmitter } from 'node:events'

/** Internal typed events. Subscribers (alerts, metrics) hang off the bus; nothing depends on them. */
export interface EventMap {
  'policy.violation': { agentId: string; timestamp: string; reason: string; detail: string; endpoint: string; transactionId: string }
  'budget.warning': { agentId: string; timestamp: string; threshold: number; usedPct: number; usedUsdc: number; dailyBudgetUsdc: number }
  'payment.completed': { agentId: string; timestamp: string; transactionId: string; protocol: string; rail: string; amountUsdc: number; endpoint: string; txHash: string }
  'payment.failed': { agentId: string; timestamp: string; transactionId: string; error: string; endpoint: string }
}

export type EventName = keyof EventMap

export class EventBus {
  private readonly emitter = new EventEmitter({ captureRejections: false })

  constructor() {
    this.emitter.setMaxListeners(100)
  }

  on<K extends EventName>(name: K, fn: (e: EventMap[K]) => void): () => void {
    this.emitter.on(name, fn)
    return () => this.emitter.off(name, fn)
  }

  /** Deliver to every subscriber; a failing subscriber never breaks the emitter or the others. */
  emit<K extends EventName>(name: K, e: EventMap[K]): void {
    for (const fn of this.emitter.listeners(name)) {
      try {
        ;(fn as (e: EventMap[K]) => void)(e)
      } catch {
        // Subscribers own their errors.
      }
    }
  }
}
