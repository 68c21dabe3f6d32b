import t from 'tap'
import pg from 'pg'
import { createServer, type AddressInfo } from 'node:net'
import { Store } from '../../src/store/index.js'
import { MIGRATIONS, SCHEMA_VERSION } from '../../src/store/postgres-schema.js'
import { sharedPostgres, testDatabase } from '../helpers/postgres.js'

const open = (url: string): Promise<Store> => Store.open('/nonexistent-unused', { postgresUrl: url })

async function sql<R extends pg.QueryResultRow>(url: string, text: string, values: unknown[] = []): Promise<R[]> {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    return (await c.query<R>(text, values)).rows
  } finally {
    await c.end()
  }
}

const versions = async (url: string): Promise<number[]> => (await sql<{ version: number }>(url, 'SELECT version FROM paygate_migrations ORDER BY version')).map((r) => r.version)

t.test('migrations are numbered 1, 2, ... in order', async (t) => {
  t.same(
    MIGRATIONS.map((m) => m.version),
    Array.from({ length: MIGRATIONS.length }, (_, i) => i + 1),
  )
  t.equal(SCHEMA_VERSION, MIGRATIONS.length)
})

t.test('an empty database is migrated at open; a second open runs nothing again', async (t) => {
  const url = await testDatabase()
  const a = await open(url)
  await a.collection('x').put('k', 1)
  await a.close()
  t.same(
    await versions(url),
    MIGRATIONS.map((m) => m.version),
  )
  const b = await open(url)
  t.teardown(() => b.close())
  t.same(
    await versions(url),
    MIGRATIONS.map((m) => m.version),
    'no version applied twice',
  )
  t.equal(await b.collection('x').get('k'), 1, 'the state kept')
})

t.test('replicas opening an empty database together migrate it once', async (t) => {
  const url = await testDatabase()
  const stores = await Promise.all(Array.from({ length: 6 }, () => open(url)))
  t.teardown(() => Promise.all(stores.map((s) => s.close())))
  t.same(
    await versions(url),
    MIGRATIONS.map((m) => m.version),
  )
  await stores[0]!.collection('x').put('k', 'from one')
  t.equal(await stores[5]!.collection('x').get('k'), 'from one', 'all on the same table')
})

t.test('a schema newer than this code knows: the open is refused, saying so, and nothing is changed', async (t) => {
  const url = await testDatabase()
  await (await open(url)).close()
  await sql(url, "INSERT INTO paygate_migrations (version, name) VALUES ($1, 'from a newer paygate')", [SCHEMA_VERSION + 1])
  await t.rejects(open(url), {
    name: 'SchemaTooNewError',
    message: new RegExp(`schema is at version ${SCHEMA_VERSION + 1}, newer than this Paygate knows \\(${SCHEMA_VERSION}\\).*refusing to start`),
  })
  t.same(await versions(url), [...MIGRATIONS.map((m) => m.version), SCHEMA_VERSION + 1])
})

t.test('a database not in UTF8 is refused', async (t) => {
  const cluster = await sharedPostgres()
  const name = `paygate_ascii_${process.pid}`
  await sql(cluster.url(), `CREATE DATABASE ${name} ENCODING 'SQL_ASCII' TEMPLATE template0`)
  await t.rejects(open(cluster.url(name)), /must use UTF8 encoding \(it uses SQL_ASCII\)/)
})

t.test('a database that does not exist fails the open, naming the setting (a configuration error)', async (t) => {
  const cluster = await sharedPostgres()
  await t.rejects(open(cluster.url('no_such_database')), {
    code: 'invalid_config',
    detail: /^store\.postgresUrl \(postgres(ql)?:\/\/[^)]*\/\[redacted\]\): PostgreSQL refused: database "no_such_database" does not exist$/,
  })
})

t.test('a server that does not answer fails the open, naming the setting, without the password (a passing trouble)', async (t) => {
  const free = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as AddressInfo
      s.close(() => resolve(port))
    })
  })
  const err = (await open(`postgres://paygate:s3cret-pw@127.0.0.1:${free}/paygate`).then(
    () => new Error('opened'),
    (e: unknown) => e,
  )) as Error & { code: string; detail: string }
  t.equal(err.code, 'unavailable')
  t.match(err.detail, /^store\.postgresUrl \(postgres:\/\/127\.0\.0\.1:\d+\/\[redacted\]\): PostgreSQL could not be reached: .*ECONNREFUSED/)
  t.notMatch(`${err.message} ${err.detail}`, /s3cret-pw/)
})
