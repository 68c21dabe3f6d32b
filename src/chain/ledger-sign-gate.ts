/**
 * The gate the ledger signing thread shares with the main thread (an Int32Array over a
 * SharedArrayBuffer): `STOP` is set when the process exits, `STATE` is `SIGNING` while the
 * thread is inside a request's signatures. See ledger-sign-thread.ts.
 */
export const GATE_STOP = 0
export const GATE_STATE = 1
export const IDLE = 0
export const SIGNING = 1
export const GATE_SLOTS = 2
