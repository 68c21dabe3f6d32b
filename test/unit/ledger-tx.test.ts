import t from 'tap'
import { randomBytes, randomInt } from 'node:crypto'
import { concat, encodeFunctionData, keccak256, serializeTransaction, toHex, toRlp, type Hex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { type Chain, type ChainInfo, unsignedHashesAgree } from '../../src/chain/chain.js'
import type { Devnet } from '../../src/chain/devnet/index.js'
import { paymentLedgerAbi } from '../../src/chain/contracts/abis.js'
import { eip1559Items, serializeEip1559, signedItems, uintBytes, unsignedEip1559, type Eip1559Fields } from '../../src/chain/eip1559.js'
import { encodeRecordCall } from '../../src/chain/ledger-call.js'
import { ledgerLocation, LedgerWriter, type LedgerEntry } from '../../src/chain/ledger-tx.js'
import { FastSigner } from '../../src/crypto/secp256k1.js'
import type { Logger } from '../../src/log/index.js'

/**
 * The hand-written record() calldata and EIP-1559 bytes must be exactly viem's (the
 * reference kept here only): randomized inputs plus the edges of every field.
 */
const MAX_UINT256 = 2n ** 256n - 1n
const pick = <T>(xs: readonly T[]): T => xs[randomInt(xs.length)]!
const hex = (n: number): Hex => `0x${randomBytes(n).toString('hex')}`
const randomBig = (maxBits: number): bigint => {
  const bits = randomInt(maxBits + 1)
  if (bits === 0) return 0n
  return BigInt(`0x${randomBytes(Math.ceil(bits / 8)).toString('hex')}`) >> BigInt(Math.ceil(bits / 8) * 8 - bits)
}
const bytes32 = (): Hex =>
  pick([
    () => `0x${'00'.repeat(32)}` as Hex,
    () => `0x${'ff'.repeat(32)}` as Hex,
    () => hex(32),
    () => `0x${'00'.repeat(randomInt(1, 32))}${randomBytes(32).toString('hex')}`.slice(0, 66) as Hex,
    () => hex(32).toUpperCase().replace('0X', '0x') as Hex,
  ])()
const ascii = (n: number): string => Array.from({ length: n }, () => String.fromCharCode(randomInt(32, 127))).join('')
const text = (): string =>
  pick([
    () => '',
    () => 'x',
    () => ascii(31),
    () => ascii(32),
    () => ascii(33),
    () => ascii(64),
    () => ascii(randomInt(0, 300)),
    () => ascii(2000),
    () => 'agent-é-ü-中文-🙂'.repeat(randomInt(1, 5)),
    () => '\ud800 lone surrogate \udfff',
    () => String.fromCodePoint(...Array.from({ length: randomInt(1, 40) }, () => randomInt(0, 0xd7ff))),
  ])()
const amount = (): bigint => pick([0n, 1n, MAX_UINT256, 2n ** 255n, 10n ** 6n, randomBig(256), randomBig(64)])
const depth = (): number => pick([0, 1, 255, 256, 0xffffffff, randomInt(0, 2 ** 32 - 1)])
const entry = (): LedgerEntry => ({
  id: bytes32(),
  parentTxHash: bytes32(),
  agentId: text(),
  amount: amount(),
  protocol: pick(['x402', 'mpp', '', text()]),
  origin: pick(['http://127.0.0.1:8080', 'https://merchant.example.com', text()]),
  pathHash: bytes32(),
  depth: depth(),
})
const viemCall = (e: LedgerEntry): Hex =>
  encodeFunctionData({ abi: paymentLedgerAbi, functionName: 'record', args: [e.id, e.parentTxHash, e.agentId, e.amount, e.protocol, e.origin, e.pathHash, e.depth] })

t.test('record() calldata equals viem encodeFunctionData', async (t) => {
  let bad = 0
  for (let i = 0; i < 3000; i++) {
    const e = entry()
    const ours = `0x${encodeRecordCall(e).toString('hex')}`
    const theirs = viemCall(e).toLowerCase()
    if (ours !== theirs && bad++ < 5) t.fail(`differs for ${JSON.stringify(e, (_, v) => (typeof v === 'bigint' ? `${v}n` : v))}`)
  }
  t.equal(bad, 0, '3,000 random entries')
})

t.test('out-of-range values are refused, as viem refuses them', async (t) => {
  const ok = entry()
  const cases: [string, LedgerEntry][] = [
    ['amount < 0', { ...ok, amount: -1n }],
    ['amount > uint256', { ...ok, amount: MAX_UINT256 + 1n }],
    ['depth > uint32', { ...ok, depth: 2 ** 32 }],
    ['depth < 0', { ...ok, depth: -1 }],
    ['short id', { ...ok, id: hex(31) }],
    ['long pathHash', { ...ok, pathHash: hex(33) }],
  ]
  for (const [name, e] of cases) {
    t.throws(() => viemCall(e), `viem: ${name}`)
    t.throws(() => encodeRecordCall(e), `ours: ${name}`)
  }
  t.throws(() => encodeRecordCall({ ...ok, depth: 1.5 }), 'fractional depth')
  const tx = { type: 'eip1559' as const, chainId: 1, nonce: 0, gas: 1n, maxFeePerGas: 1n, maxPriorityFeePerGas: 2n, to: hex(20), data: '0x' as Hex }
  t.throws(() => serializeTransaction(tx), 'viem: tip above fee cap')
  t.throws(() => serializeEip1559({ ...tx, nonce: 0n, value: 0n, to: Buffer.from(tx.to.slice(2), 'hex'), data: Buffer.alloc(0) }), 'ours: tip above fee cap')
  t.throws(() => serializeTransaction({ ...tx, chainId: 0, maxPriorityFeePerGas: 0n }), 'viem: chain id 0')
  t.throws(() => serializeEip1559({ ...tx, chainId: 0, maxPriorityFeePerGas: 0n, nonce: 0n, value: 0n, to: Buffer.from(tx.to.slice(2), 'hex'), data: Buffer.alloc(0) }), 'ours: chain id 0')
  t.throws(() => encodeRecordCall({ ...ok, id: `0x${'zz'.repeat(32)}` }), 'non-hex id')
})

t.test('EIP-1559 bytes equal viem serializeTransaction, unsigned and signed', async (t) => {
  let bad = 0
  for (let i = 0; i < 3000; i++) {
    const maxFeePerGas = pick([0n, 1n, MAX_UINT256, 50_000_000_000n, randomBig(256), randomBig(40)])
    const maxPriorityFeePerGas = maxFeePerGas === 0n ? 0n : pick([0n, 1n, maxFeePerGas, randomBig(256) % (maxFeePerGas + 1n)])
    const dataLen = pick([0, 1, 55, 56, 255, 256, 1000, 65_535, 65_536, randomInt(0, 600)])
    const data = pick([() => hex(dataLen), () => `0x${'7f'}` as Hex, () => `0x${'80'}` as Hex, () => `0x${'00'}` as Hex])()
    const tx = {
      type: 'eip1559' as const,
      chainId: pick([1, 127, 128, 31337, 8453, 2 ** 31 - 1, Number.MAX_SAFE_INTEGER, randomInt(1, 2 ** 40)]),
      nonce: pick([0, 1, 127, 128, 255, 256, Number.MAX_SAFE_INTEGER, randomInt(0, 2 ** 48 - 1)]),
      gas: pick([0n, 21_000n, 300_000n, randomBig(64)]),
      maxFeePerGas,
      maxPriorityFeePerGas,
      to: hex(20),
      value: pick([0n, 1n, randomBig(256)]),
      data,
    }
    const fields: Eip1559Fields = { ...tx, nonce: BigInt(tx.nonce), to: Buffer.from(tx.to.slice(2), 'hex'), data: Buffer.from(data.slice(2), 'hex') }
    const rs = (): Hex =>
      pick([
        () => hex(32),
        () => `0x${'00'.repeat(randomInt(1, 32))}${randomBytes(32).toString('hex')}`.slice(0, 66) as Hex,
        () => `0x${'00'.repeat(32)}` as Hex,
        () => `0x${'00'.repeat(31)}01` as Hex,
      ])()
    const sig = { r: rs(), s: rs(), yParity: pick([0, 1] as const) }
    const oursU = `0x${serializeEip1559(fields).toString('hex')}`
    const oursS = `0x${serializeEip1559(fields, { r: Buffer.from(sig.r.slice(2), 'hex'), s: Buffer.from(sig.s.slice(2), 'hex'), yParity: sig.yParity }).toString('hex')}`
    if ((oursU !== serializeTransaction(tx) || oursS !== serializeTransaction(tx, sig)) && bad++ < 5)
      t.fail(`differs: ${JSON.stringify({ ...tx, data: data.slice(0, 80), sig }, (_, v) => (typeof v === 'bigint' ? `${v}n` : v))}`)
  }
  t.equal(bad, 0, '3,000 random transactions')
})

t.test('LedgerWriter.sign equals viem: encodeFunctionData + signTransaction, and the hash of the raw tx', async (t) => {
  for (const embedded of [true, false]) {
    for (let round = 0; round < 10; round++) {
      const pk = generatePrivateKey()
      const account = privateKeyToAccount(pk)
      const ledger = privateKeyToAccount(generatePrivateKey()).address
      const chainId = pick([31337, 8453, randomInt(1, 2 ** 31)])
      const maxFeePerGas = randomBig(60) + 1n
      const est = { maxFeePerGas, maxPriorityFeePerGas: randomBig(40) % (2n * maxFeePerGas + 1n) }
      const chain = {
        embedded,
        info: { chainId, ledger },
        fastSigner: new FastSigner(pk),
        publicClient: { estimateFeesPerGas: async () => est },
      } as unknown as Chain
      const writer = new LedgerWriter(chain)
      await writer.refreshFees()
      const fees = embedded ? { maxFeePerGas: 50_000_000_000n, maxPriorityFeePerGas: 1n } : { maxFeePerGas: est.maxFeePerGas * 2n, maxPriorityFeePerGas: est.maxPriorityFeePerGas }
      for (let i = 0; i < 30; i++) {
        const e = entry()
        const nonce = BigInt(pick([0, 1, 127, 128, randomInt(0, 2 ** 40)]))
        const signed = writer.sign(e, nonce)
        const raw = await account.signTransaction({ type: 'eip1559', chainId, to: ledger, data: viemCall(e), nonce: Number(nonce), gas: 300_000n, ...fees })
        t.equal(signed.raw, raw)
        t.equal(signed.hash, keccak256(raw))
      }
    }
  }
})

t.test("unsigned transactions: viem's bytes with a zero signature; eip1559Items reads back either kind", async (t) => {
  let bad = 0
  for (let i = 0; i < 1000; i++) {
    const maxFeePerGas = pick([1n, 50_000_000_000n, randomBig(256)])
    const tx = {
      type: 'eip1559' as const,
      chainId: pick([1, 31337, 84532, randomInt(1, 2 ** 40)]),
      nonce: pick([0, 1, 127, 128, randomInt(0, 2 ** 48 - 1)]),
      gas: pick([21_000n, 300_000n, randomBig(64)]),
      maxFeePerGas,
      maxPriorityFeePerGas: randomBig(256) % (maxFeePerGas + 1n),
      to: hex(20),
      value: pick([0n, 1n, randomBig(256)]),
      data: hex(pick([0, 1, 55, 56, 1000, randomInt(0, 600)])),
    }
    const fields: Eip1559Fields = { ...tx, nonce: BigInt(tx.nonce), to: Buffer.from(tx.to.slice(2), 'hex'), data: Buffer.from(tx.data.slice(2), 'hex') }
    const unsigned = unsignedEip1559(fields)
    const zero = { r: `0x${'00'.repeat(32)}` as Hex, s: `0x${'00'.repeat(32)}` as Hex, yParity: 0 as const }
    const sig = { r: hex(32), s: hex(32), yParity: pick([0, 1] as const) }
    const signedRaw = serializeEip1559(fields, { r: Buffer.from(sig.r.slice(2), 'hex'), s: Buffer.from(sig.s.slice(2), 'hex'), yParity: sig.yParity })
    const back = eip1559Items(unsigned)
    const backSigned = eip1559Items(signedRaw)
    const bytesHex = (b: Uint8Array): string => Buffer.from(b).toString('hex')
    const want = [
      uintBytes(BigInt(fields.chainId), ''),
      uintBytes(fields.nonce, ''),
      uintBytes(fields.maxPriorityFeePerGas, ''),
      uintBytes(fields.maxFeePerGas, ''),
      uintBytes(fields.gas, ''),
      fields.to,
      uintBytes(fields.value, ''),
      fields.data,
    ]
      .map(bytesHex)
      .join(' ')
    const got = (items: Uint8Array[]): string => items.slice(0, 8).map(bytesHex).join(' ')
    const ok = `0x${unsigned.toString('hex')}` === serializeTransaction(tx, zero) && !signedItems(back) && signedItems(backSigned) && got(back) === want && got(backSigned) === want
    if (!ok && bad++ < 5) t.fail(`differs: ${JSON.stringify(tx, (_, v) => (typeof v === 'bigint' ? `${v}n` : v)).slice(0, 300)}`)
  }
  t.equal(bad, 0, '1,000 random transactions')
  t.throws(() => eip1559Items(Buffer.from('02c0', 'hex')), RangeError, 'a list of the wrong length is refused')
  t.throws(() => eip1559Items(Buffer.from('01c0', 'hex')), RangeError, 'another type is refused')
})

t.test("unsigned records: viem's bytes with a zero signature, and the hash anvil gives them (keccak of their RLP, then the sender)", async (t) => {
  const pk = generatePrivateKey()
  const address = privateKeyToAccount(pk).address
  const chain = { embedded: true, unsignedLedger: true, info: { chainId: 31337, ledger: privateKeyToAccount(generatePrivateKey()).address }, fastSigner: new FastSigner(pk) } as unknown as Chain
  const writer = new LedgerWriter(chain)
  await writer.refreshFees()
  const e = entry()
  const made = writer.sign(e, 7n)
  const viemUnsigned = serializeTransaction(
    { type: 'eip1559', chainId: 31337, to: chain.info.ledger, data: viemCall(e), nonce: 7, gas: 300_000n, maxFeePerGas: 50_000_000_000n, maxPriorityFeePerGas: 1n },
    { r: `0x${'00'.repeat(32)}`, s: `0x${'00'.repeat(32)}`, yParity: 0 },
  )
  t.equal(made.raw, viemUnsigned, 'the record with a zero signature')
  t.equal(made.hash, keccak256(concat([toRlp(viemUnsigned), address])), 'its hash: keccak of its RLP, then the sender')
  const group = await writer.signMany([
    { entry: e, nonce: 8n },
    { entry: entry(), nonce: 9n },
  ])
  t.ok(
    group.every((g) => !signedItems(eip1559Items(Buffer.from(g.raw.slice(2), 'hex')))),
    'a group is made unsigned too',
  )
  t.not(writer.stamp(), new LedgerWriter({ ...chain, unsignedLedger: false } as unknown as Chain).stamp(), 'a record made under one kind is not taken as made under the other')
})

t.test('the embedded chain is asked how it hashes an unsigned record; one that hashes otherwise gets signed records', async (t) => {
  const key = new FastSigner(generatePrivateKey())
  const info = { chainId: 31337, ledger: privateKeyToAccount(generatePrivateKey()).address } as ChainInfo
  const warned: unknown[] = []
  const log = { warn: (o: unknown) => warned.push(o) } as unknown as Logger
  const agreeing = { probeUnsigned: async (from: string, raw: Hex) => keccak256(concat([toRlp(raw), from as Hex])) } as unknown as Devnet
  t.equal(await unsignedHashesAgree(agreeing, key, info, 0, log), true)
  t.same(warned, [])
  const other = { probeUnsigned: async () => `0x${'cd'.repeat(32)}` } as unknown as Devnet
  t.equal(await unsignedHashesAgree(other, key, info, 0, log), false)
  const refusing = { probeUnsigned: async () => Promise.reject(new Error('no such method')) } as unknown as Devnet
  t.equal(await unsignedHashesAgree(refusing, key, info, 0, log), false)
  t.equal(warned.length, 2, 'each said why')
  t.match(JSON.stringify(warned[1]), /refused \(no such method\)/)
})

t.test('the signing thread: the same bytes as signing in place, in request order; a bad record fails alone; a stopped thread falls back to the main thread', async (t) => {
  const pk = generatePrivateKey()
  const ledger = privateKeyToAccount(generatePrivateKey()).address
  const chain = { embedded: true, info: { chainId: 31337, ledger }, fastSigner: new FastSigner(pk) } as unknown as Chain
  const warned: string[] = []
  const log = { warn: (_: unknown, msg: string) => warned.push(msg) } as unknown as Logger
  const threaded = new LedgerWriter(chain, { thread: true, log })
  const inPlace = new LedgerWriter(chain)
  await Promise.all([threaded.refreshFees(), inPlace.refreshFees()])
  t.teardown(() => threaded.close())
  const main = threaded.sign.bind(threaded)
  let onMain = 0
  threaded.sign = (e, n) => {
    onMain++
    return main(e, n)
  }
  const groups = Array.from({ length: 8 }, (_, g) => Array.from({ length: 1 + g * 3 }, (_, i) => ({ entry: entry(), nonce: BigInt(g * 100 + i) })))
  const signed = await Promise.all(groups.map((items) => threaded.signMany(items)))
  groups.forEach((items, g) => {
    t.same(
      signed[g],
      items.map((i) => inPlace.sign(i.entry, i.nonce)),
      `group ${g}: ${items.length} records, the bytes and hashes of signing in place`,
    )
  })
  // unsigned records (the embedded chain) are made in place: no thread is started for them
  const unsignedChain = { ...chain, unsignedLedger: true } as unknown as Chain
  const threadedUnsigned = new LedgerWriter(unsignedChain, { thread: true })
  t.teardown(() => threadedUnsigned.close())
  t.equal((threadedUnsigned as unknown as { thread?: unknown }).thread, undefined, 'no signing thread for unsigned records')
  const items = groups[4]!
  const made = await threadedUnsigned.signMany(items)
  t.same(
    made,
    items.map((i) => new LedgerWriter(unsignedChain).sign(i.entry, i.nonce)),
    'unsigned in a group: the bytes and hashes made one by one',
  )
  t.notSame(made, signed[4], 'and not the signed ones')
  const bad = { ...entry(), id: '0x12' as Hex }
  await t.rejects(
    threaded.signMany([
      { entry: entry(), nonce: 1n },
      { entry: bad, nonce: 2n },
    ]),
    /id must be 32 bytes/,
    'a record that cannot be signed fails its request',
  )
  const after = entry()
  t.same(await threaded.signMany([{ entry: after, nonce: 3n }]), [inPlace.sign(after, 3n)], 'and the thread goes on')
  t.equal(onMain, 0, 'nothing was signed on the main thread')
  t.same(warned, [])
  // The thread dies (here: a message it cannot read throws on it): what waits, and what follows, is signed on the main thread.
  const thread = (threaded as unknown as { thread: { thread: { postMessage(m: unknown): void } } }).thread
  thread.thread.postMessage(null)
  const waiting = threaded.signMany([{ entry: after, nonce: 4n }])
  t.same(await waiting, [inPlace.sign(after, 4n)], 'a request waiting when the thread died is signed on the main thread')
  t.same(await threaded.signMany([{ entry: after, nonce: 5n }]), [inPlace.sign(after, 5n)], 'and so is the next one')
  t.same(warned, ['the ledger signing thread stopped; signing on the main thread from now on'], 'said once')
})

t.test('closing the signing thread answers what was asked before it, then the thread ends', async (t) => {
  const pk = generatePrivateKey()
  const ledger = privateKeyToAccount(generatePrivateKey()).address
  const chain = { embedded: true, info: { chainId: 31337, ledger }, fastSigner: new FastSigner(pk) } as unknown as Chain
  const warned: string[] = []
  const writer = new LedgerWriter(chain, { thread: true, log: { warn: (_: unknown, msg: string) => warned.push(msg) } as unknown as Logger })
  await writer.refreshFees()
  const inner = (writer as unknown as { thread: { alive: boolean } }).thread
  const items = Array.from({ length: 200 }, (_, i) => ({ entry: entry(), nonce: BigInt(i) }))
  const asked = writer.signMany(items)
  await writer.close()
  t.equal(inner.alive, false, 'the thread is stopped')
  t.equal((await asked).length, 200, 'what was asked before the close was answered')
  t.same(warned, [], 'by the thread: no fallback was needed')
})

t.test('ledgerLocation: origin and path hash, kept per URL and frozen', async (t) => {
  const urls = ['http://127.0.0.1:8080/paid', 'https://merchant.example.com/a/b?q=1#f', 'https://user:pw@merchant.example.com:8443/x%20y', 'http://[::1]:9/']
  for (const url of urls) {
    const u = new URL(url)
    const want = { origin: u.origin, pathHash: keccak256(toHex(u.pathname)) }
    t.same(ledgerLocation(url), want, url)
    const again = ledgerLocation(url)
    t.equal(again, ledgerLocation(url), 'the same object from the cache')
    t.same(again, want)
    t.ok(Object.isFrozen(again))
  }
  t.throws(() => ledgerLocation('not a url'))
})

t.test('entryOf reads back the entry a stored record records, signed or unsigned (a record recorded again under a new nonce)', async (t) => {
  const pk = generatePrivateKey()
  const info = { chainId: 31337, ledger: privateKeyToAccount(generatePrivateKey()).address }
  const writers = [true, false].map((unsignedLedger) => new LedgerWriter({ embedded: true, unsignedLedger, info, fastSigner: new FastSigner(pk) } as unknown as Chain))
  for (const w of writers) await w.refreshFees()
  // Strings that survive UTF-8 (a lone surrogate is written as U+FFFD, so it reads back otherwise).
  const utf8 = (s: string): boolean => Buffer.from(s, 'utf8').toString('utf8') === s
  let checked = 0
  for (let i = 0; i < 200; i++) {
    const e = entry()
    if (![e.agentId, e.protocol, e.origin].every(utf8)) continue
    const lower = { ...e, id: e.id.toLowerCase() as Hex, parentTxHash: e.parentTxHash.toLowerCase() as Hex, pathHash: e.pathHash.toLowerCase() as Hex }
    for (const w of writers) t.same(w.entryOf(w.sign(e, BigInt(i)).raw), lower)
    checked++
  }
  t.ok(checked > 100, `${checked} entries read back`)
  t.throws(() => writers[0]!.entryOf('0x01'), /EIP-1559/, 'not a ledger transaction')
})
