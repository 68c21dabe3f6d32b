import t from 'tap'
import { readFileSync } from 'node:fs'
import { ERROR_STATUS } from '../../src/errors/index.js'
import { TX_STATUSES } from '../../src/ledger/transactions.js'
import { Contract, DOC_FILE, type Answer } from '../helpers/openapi-contract.js'

/**
 * The contract checker can fail: wrong bodies, undocumented fields and statuses, the wrong
 * content type, a body where none is documented, a 405 whose Allow is off all are rejected;
 * and the document decides, for every object schema, whether other fields are allowed.
 */
const contract = new Contract()
const json = (status: number, body: unknown, headers: Record<string, string> = {}): Answer => ({
  status,
  headers: { 'content-type': 'application/json; charset=utf-8', ...headers },
  text: JSON.stringify(body),
})

t.test('a valid answer passes', async (t) => {
  t.same(contract.check('GET', '/v1/me', json(200, { kind: 'agent', keyId: 'key_1', agentId: 'a' })), [])
  t.same(contract.check('GET', '/v1/agents/a', json(404, { error: 'not_found', detail: 'agent a does not exist' })), [])
  t.same(contract.check('DELETE', '/v1/agents/a', { status: 204, headers: {}, text: '' }), [])
  t.same(contract.check('GET', '/v1/ca.pem', { status: 200, headers: { 'content-type': 'application/x-pem-file' }, text: '-----BEGIN CERTIFICATE-----' }), [])
})

t.test('a wrong body, a missing field, an undocumented field fail', async (t) => {
  t.match(contract.check('GET', '/v1/me', json(200, { kind: 'robot', keyId: 'key_1' })), [/body\/kind must be equal to one of the allowed values/])
  t.match(contract.check('GET', '/v1/me', json(200, { kind: 'account' })), [/must have required property 'keyId'/])
  t.match(contract.check('GET', '/v1/me', json(200, { kind: 'account', keyId: 'k', secret: 'x' })), [/must NOT have additional properties/])
  t.match(contract.check('GET', '/v1/agents/a', json(200, { agentId: 'a', createdAt: 'yesterday' })), [/must match format "date-time"/])
  t.match(contract.check('GET', '/v1/agents/a', json(404, { detail: 'no error code' })), [/must have required property 'error'/])
  t.match(contract.check('GET', '/v1/agents/a', json(404, { error: 'gone', detail: 'x' })), [/body\/error must be equal to one of the allowed values/])
  t.match(contract.check('GET', '/v1/me', { status: 200, headers: { 'content-type': 'application/json' }, text: '{not json' }), [/is not JSON/])
})

t.test('an undocumented status, content type or body fails', async (t) => {
  t.match(contract.check('GET', '/v1/me', json(418, { error: 'teapot', detail: 'x' })), [/status 418 is not documented/])
  t.match(contract.check('GET', '/v1/me', { status: 200, headers: { 'content-type': 'text/html' }, text: '<p>' }), [/content type text\/html is not one of application\/json/])
  t.match(contract.check('GET', '/v1/me', { status: 200, headers: {}, text: '{}' }), [/content type null/])
  t.match(contract.check('DELETE', '/v1/agents/a', { status: 204, headers: {}, text: 'surprise' }), [/gives no body/])
  t.match(contract.check('GET', '/v1/nothing', json(404, { error: 'not_found', detail: 'x' })), [/no documented path matches/])
})

t.test('paths: a literal path belongs to its own template; a method the path lacks must be a 405 with the documented Allow', async (t) => {
  t.same(contract.find('POST', '/v1/agents/invoke'), { path: '/v1/agents/invoke' })
  t.same(contract.find('GET', '/v1/agents/invoke?x=1'), { allow: ['POST'] }, 'not /v1/agents/{agentId} with the id invoke')
  t.same(contract.find('GET', '/v1/agents/a'), { path: '/v1/agents/{agentId}' })
  t.same(contract.find('PUT', '/v1/agents/a'), { allow: ['DELETE', 'GET'] })
  t.equal(contract.find('GET', '/v1/agents/a/b/c'), null)
  const e = { error: 'method_not_allowed', detail: 'x' }
  t.same(contract.check('PUT', '/v1/agents/a', json(405, e, { allow: 'GET, DELETE' })), [])
  t.match(contract.check('PUT', '/v1/agents/a', json(405, e, { allow: 'GET' })), [/Allow is \[GET\], the document has \[DELETE,GET\]/])
  t.match(contract.check('PUT', '/v1/agents/a', json(200, {}, { allow: 'GET, DELETE' })), [/not 405/])
})

t.test('what was checked is recorded against what is documented', async (t) => {
  const c = new Contract()
  c.check('GET', '/v1/me', json(200, { kind: 'account', keyId: 'k' }))
  c.check('GET', '/v1/me', json(418, {}))
  t.same([...c.seen].sort(), ['GET /v1/me 200', 'GET /v1/me 418'])
  t.ok(c.documented(['/v1/me']).has('GET /v1/me 401'))
  t.notOk(c.documented(['/v1/me']).has('GET /v1/me 418'))
})

t.test('strict mode: a schema with a typo or a required field it does not define does not compile', async (t) => {
  const doc = JSON.parse(readFileSync(DOC_FILE, 'utf8'))
  doc.paths['/v1/me'].get.responses['200'].content['application/json'].schema.requried = ['kind']
  t.throws(() => new Contract(doc).compileAll(), /unknown keyword: "requried"/)
  const doc2 = JSON.parse(readFileSync(DOC_FILE, 'utf8'))
  doc2.paths['/v1/me'].get.responses['200'].content['application/json'].schema.required.push('role')
  t.throws(() => new Contract(doc2).compileAll(), /required property "role" is not defined/)
  t.doesNotThrow(() => contract.compileAll(), 'the document as it is compiles')
})

t.test('every object schema with properties decides whether other fields are allowed; only the document itself allows them', async (t) => {
  const open: string[] = []
  const undecided: string[] = []
  const walk = (node: unknown, at: string): void => {
    if (Array.isArray(node)) {
      for (const [i, n] of node.entries()) walk(n, `${at}/${i}`)
      return
    }
    if (node === null || typeof node !== 'object') return
    const o = node as Record<string, unknown>
    const object = o.type === 'object' || (Array.isArray(o.type) && o.type.includes('object'))
    // An object schema without properties is a map: it says what its values are, or it accepts anything.
    if (object && !o.properties && o.additionalProperties === undefined && !at.startsWith('GET /v1/openapi.json')) undecided.push(at)
    if (o.properties) {
      if (o.additionalProperties === undefined) undecided.push(at)
      else if (o.additionalProperties === true) open.push(at)
    }
    // if/then/not only constrain the shape around them (the depth-0 node has no protocol): not shapes of their own.
    for (const [k, v] of Object.entries(o)) if (!['if', 'then', 'not'].includes(k)) walk(v, `${at}/${k}`)
  }
  walk(contract.doc.components.schemas, '#/components/schemas')
  for (const [path, item] of Object.entries(contract.doc.paths as Record<string, Record<string, any>>)) {
    for (const [method, op] of Object.entries(item)) if (method !== 'parameters') walk(op.responses, `${method.toUpperCase()} ${path}`)
  }
  t.same(undecided, [], 'no object schema leaves additionalProperties undecided')
  t.same(open, ['GET /v1/openapi.json/200/content/application/json/schema'], 'only the document itself (OpenAPI has its own schema) is open')
})

t.test("the error body's codes are exactly the codes Paygate has", async (t) => {
  t.same([...contract.doc.components.schemas.Error.properties.error.enum].sort(), Object.keys(ERROR_STATUS).sort())
})

t.test("GET /v1/transactions' status filter lists every status the server accepts (invocation roots' too)", async (t) => {
  const param = contract.doc.paths['/v1/transactions'].get.parameters.find((p: { name: string }) => p.name === 'status')
  t.same([...param.schema.enum].sort(), [...TX_STATUSES].sort())
})

t.test("the spec's depth-0 rule: the root of a chain or tree has no protocol or endpoint", async (t) => {
  const node = { txHash: '0x1', agentId: 'a', amountPaid: { usdc: 0 }, depth: 0, status: 'paid', children: [] }
  const tree = (root: unknown) => json(200, { root, totalCost: { usdc: 0 }, txCount: 0 })
  t.same(contract.check('GET', '/v1/transactions/x/tree', tree(node)), [])
  t.match(contract.check('GET', '/v1/transactions/x/tree', tree({ ...node, protocol: 'x402' })), [/body\/root\/protocol boolean schema is false/])
  const link = { txHash: '0x2', agentId: 'a', amountPaid: { usdc: 0.01 }, protocol: 'x402', endpoint: 'http://t/paid' }
  t.same(contract.check('GET', '/v1/transactions/x/chain', json(200, { root: '0x1', chain: [{ ...link, depth: 1 }] })), [])
  t.match(contract.check('GET', '/v1/transactions/x/chain', json(200, { root: '0x1', chain: [{ ...link, depth: 0 }] })), [/body\/chain\/0\/protocol boolean schema is false/])
})
