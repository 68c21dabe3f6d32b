import type { Test } from 'tap'
import type { Hex } from 'viem'
import type { TestGateway } from './gateway.js'

type Items = readonly { entry: unknown; nonce: bigint }[]
type Made = { raw: Hex; hash: Hex }

/**
 * Watch how the outbox makes ledger records: those made on the main thread (ahead, while a lone
 * payment's retry is on the wire) and those made in groups (`signMany`: on the signing thread
 * when records are signed). `thread` is the signing thread's state when watching began; `raws` holds each record's transaction by its hash.
 */
export function watchSigning(t: Test, gw: TestGateway) {
  const outbox = gw.gw.outbox as unknown as {
    signAhead(e: unknown): void
    record(...a: unknown[]): Promise<Hex>
    writer: { signMany(items: Items): Promise<Made[]>; sign(e: unknown, n: bigint): Made; thread?: { alive: boolean } }
  }
  const ahead = outbox.signAhead.bind(outbox)
  const record = outbox.record.bind(outbox)
  const signMany = outbox.writer.signMany.bind(outbox.writer)
  const sign = outbox.writer.sign.bind(outbox.writer)
  const calls = { thread: outbox.writer.thread?.alive, ahead: 0, onMain: [] as Hex[], inGroups: [] as Hex[], requests: 0, mainBeforeRecord: -1, raws: new Map<Hex, Hex>() }
  outbox.record = (...a) => {
    calls.mainBeforeRecord = calls.onMain.length
    return record(...a)
  }
  outbox.signAhead = (e) => {
    calls.ahead++
    ahead(e)
  }
  outbox.writer.signMany = async (items) => {
    calls.requests++
    const s = await signMany(items)
    calls.inGroups.push(...s.map((x) => x.hash))
    for (const x of s) calls.raws.set(x.hash, x.raw)
    return s
  }
  outbox.writer.sign = (e, n) => {
    const s = sign(e, n)
    calls.onMain.push(s.hash)
    calls.raws.set(s.hash, s.raw)
    return s
  }
  t.teardown(() => {
    outbox.signAhead = ahead
    outbox.record = record
    outbox.writer.signMany = signMany
    outbox.writer.sign = sign
  })
  return calls
}

/** Payments made together: each its own ledger transaction, each made by the outbox, most of them in groups (on the signing thread when records are signed). */
export function madeTogether(t: Test, calls: ReturnType<typeof watchSigning>, hashes: readonly Hex[]): void {
  t.equal(new Set(hashes).size, hashes.length, 'a ledger transaction each')
  const made = new Set([...calls.onMain, ...calls.inGroups])
  t.ok(
    hashes.every((h) => made.has(h)),
    'each was made by the outbox',
  )
  t.ok(
    calls.inGroups.filter((h) => hashes.includes(h)).length >= hashes.length / 2,
    `most in groups (${calls.inGroups.length} in ${calls.requests} requests${calls.thread ? ' to the signing thread' : ''}, ${calls.onMain.length} ahead on the main thread)`,
  )
}

/**
 * A lone payment (`txHash` its answer's): its record made once on the main thread, ahead while
 * the retry was on the wire, or when the answer came first, as it is recorded.
 */
export function madeAhead(t: Test, calls: ReturnType<typeof watchSigning>, txHash: Hex): void {
  t.equal(calls.ahead, 1, 'asked to make it ahead')
  t.ok(calls.mainBeforeRecord === 0 || calls.mainBeforeRecord === 1, `made before or as the paid answer was recorded (${calls.mainBeforeRecord} before)`)
  t.same(calls.onMain, [txHash], "made once, and its hash is the answer's txHash")
  t.same(calls.inGroups, [], 'nothing asked of the signing thread')
}
