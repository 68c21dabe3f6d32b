import t from 'tap'
import { keccak256, toHex } from 'viem'
import { generatePrivateKey, privateKeyToAccount } from 'viem/accounts'
import { signEip1559 } from '../../src/chain/eip1559.js'
import { keccak256Bytes } from '../../src/crypto/keccak.js'
import { FastSigner } from '../../src/crypto/secp256k1.js'

t.test('native signatures are byte-identical to viem (RFC 6979)', async (t) => {
  for (let i = 0; i < 20; i++) {
    const pk = generatePrivateKey()
    const viemAccount = privateKeyToAccount(pk)
    const fast = new FastSigner(pk)
    t.equal(fast.address, viemAccount.address)
    const digest = keccak256(toHex(`message ${i}`))
    t.equal(fast.signDigest65(digest), await viemAccount.sign({ hash: digest }))
    const tx = { type: 'eip1559' as const, chainId: 31337, to: viemAccount.address, data: toHex(`data ${i}`), nonce: i, gas: 300_000n, maxFeePerGas: 50n * 10n ** 9n, maxPriorityFeePerGas: 1n }
    const raw = signEip1559({ ...tx, nonce: BigInt(tx.nonce), value: 0n, to: Buffer.from(tx.to.slice(2), 'hex'), data: Buffer.from(tx.data.slice(2), 'hex') }, (payload) =>
      fast.signDigestBytes(keccak256Bytes(payload)),
    )
    t.equal(`0x${raw.toString('hex')}`, await viemAccount.signTransaction(tx))
  }
})
