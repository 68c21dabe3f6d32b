import t from 'tap'
import { randomBytes, randomInt } from 'node:crypto'
import { keccak256 as viemKeccak, toHex } from 'viem'
import { keccak256, keccak256Bytes } from '../../src/crypto/keccak.js'

t.test('keccak256 equals viem on bytes, hex and UTF-8, across block boundaries', async (t) => {
  // 136 bytes is keccak-256's block: lengths around it and its multiples exercise the padding.
  const lengths = [0, 1, 31, 32, 33, 55, 56, 135, 136, 137, 271, 272, 273, 1000, 5000]
  for (let i = 0; i < 500; i++) lengths.push(randomInt(0, 2000))
  let bad = 0
  for (const n of lengths) {
    const b = randomBytes(n)
    const want = viemKeccak(b)
    if (keccak256(b) !== want || keccak256(toHex(b)) !== want || `0x${keccak256Bytes(b).toString('hex')}` !== want) bad++
  }
  t.equal(bad, 0, `${lengths.length} inputs`)
  t.equal(keccak256('héllo 🙂', 'utf8'), viemKeccak(toHex('héllo 🙂')))
  // A Uint8Array view into a larger buffer hashes only its own bytes.
  const big = randomBytes(300)
  const view = new Uint8Array(big.buffer, big.byteOffset + 7, 100)
  t.equal(keccak256(view), viemKeccak(big.subarray(7, 107)))
  // Reusing the sponge leaves nothing behind between calls.
  t.equal(keccak256('0x'), '0xc5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470')
})
