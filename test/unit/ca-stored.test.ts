import { X509Certificate } from 'node:crypto'
import t from 'tap'
import { CertificateAuthority } from '../../src/proxy/ca.js'
import { CA_COLLECTION, CA_ENTRY, type StoredCa } from '../../src/proxy/ca-stored.js'
import { Store } from '../../src/store/index.js'
import { Keystore } from '../../src/wallet/keystore.js'
import { testDir, testStore } from '../helpers/gateway.js'

/** The interception CA kept in the store (replicas on PostgreSQL), against a real LevelDB and a real PostgreSQL. */

const KEY_A = 'a1'.repeat(32)
const KEY_B = 'b2'.repeat(32)

async function keystore(store: Store, dir: string, key: string): Promise<Keystore> {
  return (await Keystore.open(dir, key, store.collection('meta'))).keystore
}

t.test('created once, then loaded: the same CA, keys encrypted in the store, leaves that chain to it', async (t) => {
  const { store, dir } = await testStore(t)
  const ks = await keystore(store, dir, KEY_A)
  const coll = store.collection<StoredCa>(CA_COLLECTION)
  const first = await CertificateAuthority.loadStored(coll, ks)
  t.same(first.created, { ca: true, leafKey: true })
  const stored = (await coll.get(CA_ENTRY))!
  t.equal(stored.certPem, first.certPem)
  for (const k of [stored.caKey, stored.leafKey]) t.notOk(k.includes('PRIVATE KEY'), 'a key is not stored in the clear')
  t.notOk(JSON.stringify(stored).includes(first.leafKeyPem.split('\n')[1]!), 'nor any line of it')

  const again = await CertificateAuthority.loadStored(coll, ks)
  t.same(again.created, { ca: false, leafKey: false })
  t.equal(again.certPem, first.certPem)
  t.equal(again.leafKeyPem, first.leafKeyPem)
  const leaf = new X509Certificate(again.leafFor('api.example.com').cert)
  t.ok(leaf.checkIssued(new X509Certificate(first.certPem)) && leaf.verify(new X509Certificate(first.certPem).publicKey), 'a leaf minted after loading chains to the stored CA')
  t.equal(first.files.caCert, "the store's ca/authority (certPem)", 'named by where it is')
})

t.test('another master key cannot open it', async (t) => {
  const { store, dir } = await testStore(t)
  const coll = store.collection<StoredCa>(CA_COLLECTION)
  await CertificateAuthority.loadStored(coll, await keystore(store, dir, KEY_A))
  const other = (await Keystore.open(testDir(t), KEY_B, (await testStore(t)).store.collection('meta'))).keystore
  await t.rejects(CertificateAuthority.loadStored(coll, other), { code: 'invalid_config', message: /cannot be decrypted with this master key: every replica needs the same masterKey/ })
})

t.test('on PostgreSQL, replicas loading together under the init lock make one CA', async (t) => {
  const { store, dir, url } = await testStore(t, undefined, 'postgres')
  await keystore(store, dir, KEY_A)
  const others = await Promise.all([1, 2, 3].map(() => Store.open(testDir(t), { postgresUrl: url! })))
  t.teardown(() => Promise.all(others.map((s) => s.close())))
  const cas = await Promise.all(
    others.map(async (s) => {
      const ks = await keystore(s, testDir(t), KEY_A)
      return s.withInitLock(() => CertificateAuthority.loadStored(s.collection<StoredCa>(CA_COLLECTION), ks))
    }),
  )
  t.equal(cas.filter((c) => c.created.ca).length, 1, 'one replica created it')
  t.equal(new Set(cas.map((c) => c.certPem)).size, 1, 'every replica has the same certificate')
  t.equal(new Set(cas.map((c) => c.leafKeyPem)).size, 1, 'and the same leaf key')
})
