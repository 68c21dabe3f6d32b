import t from 'tap'
import { existsSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { Keystore } from '../../src/wallet/keystore.js'
import { PaygateError } from '../../src/errors/index.js'
import { testStore } from '../helpers/gateway.js'

t.test('master key file, encryption round trip, and a wrong key refused', async (t) => {
  const { store, dir } = await testStore(t)
  const meta = store.collection<string>('meta')
  const first = await Keystore.open(dir, null, meta)
  t.equal(first.source, 'file')
  t.ok(first.created)
  const file = join(dir, 'master-key')
  const pending = join(dir, 'master-key.new')
  t.notOk(existsSync(file), 'no master-key until the start commits it')
  t.equal(statSync(pending).mode & 0o777, 0o600)
  // A start that failed before commit: the next one takes up the pending key (the store's check was written with it).
  const retried = await Keystore.open(dir, null, meta)
  t.notOk(retried.created, 'the pending key is reused, not replaced')
  retried.commit()
  t.notOk(existsSync(pending), 'renamed on commit')
  t.equal(statSync(file).mode & 0o777, 0o600)
  t.match(readFileSync(file, 'utf8'), /^[0-9a-f]{64}\n$/)

  const secret = Buffer.from('11'.repeat(32), 'hex')
  const blob = first.keystore.encrypt(secret, 'wallet:a:0xabc')
  t.notOk(blob.includes(secret.toString('hex')) || blob.includes(secret.toString('base64')), 'ciphertext does not show the secret')
  t.same(first.keystore.decrypt(blob, 'wallet:a:0xabc'), secret)
  t.throws(() => first.keystore.decrypt(blob, 'wallet:b:0xabc'), 'bound to its context')
  t.not(first.keystore.encrypt(secret, 'x'), first.keystore.encrypt(secret, 'x'), 'fresh IV each time')

  const again = await Keystore.open(dir, null, meta)
  t.notOk(again.created, 'the file is reused')
  t.same(again.keystore.decrypt(blob, 'wallet:a:0xabc'), secret)

  const same = readFileSync(file, 'utf8').trim()
  const viaConfig = await Keystore.open(dir, same, meta)
  t.equal(viaConfig.source, 'config')
  t.same(viaConfig.keystore.decrypt(blob, 'wallet:a:0xabc'), secret, 'the same key given in config works (hex)')
  const b64 = Buffer.from(same, 'hex').toString('base64')
  t.equal((await Keystore.open(dir, b64, meta)).source, 'config', 'and in base64')

  try {
    await Keystore.open(dir, 'ab'.repeat(32), meta)
    t.fail('a wrong master key must refuse')
  } catch (e) {
    t.ok(e instanceof PaygateError && e.code === 'invalid_config')
    t.match((e as Error).message, /master key .* cannot decrypt/)
    t.notMatch((e as Error).message, /abab/, 'the key is not echoed')
  }
})
