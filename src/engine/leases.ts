/**
 * Which transactions this process is still working on: a payment is leased from its
 * reservation until the engine is done with it, and the reconciler touches only records
 * nobody holds. In one process a lease lives as long as the work; with several replicas on
 * one database it becomes an owner and heartbeat on the record (see docs/architecture.md).
 */
export class Leases {
  private readonly held = new Set<string>()

  take(transactionId: string): void {
    this.held.add(transactionId)
  }

  drop(transactionId: string): void {
    this.held.delete(transactionId)
  }

  isHeld(transactionId: string): boolean {
    return this.held.has(transactionId)
  }

  /** How many payments are under way (a lone one may sign its ledger record ahead). */
  get size(): number {
    return this.held.size
  }
}
