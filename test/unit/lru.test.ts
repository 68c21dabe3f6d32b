import t from 'tap'
import { deepFreeze, Lru } from '../../src/util/lru.js'

t.test('Lru keeps the most recently used entries up to its bound', async (t) => {
  const c = new Lru<string, number>(3)
  c.set('a', 1)
  c.set('b', 2)
  c.set('c', 3)
  t.equal(c.get('a'), 1) // a is now the newest
  c.set('d', 4) // drops b, the least recently used
  t.equal(c.size, 3)
  t.equal(c.get('b'), undefined)
  t.same([c.get('a'), c.get('c'), c.get('d')], [1, 3, 4])
  c.set('c', 30) // replacing does not grow it
  t.equal(c.size, 3)
  t.equal(c.get('c'), 30)
})

t.test('deepFreeze freezes everything reachable, shared and cyclic parts included', async (t) => {
  const shared = { x: [1, { y: 2 }] }
  const v = { a: shared, b: shared, list: [{ z: 1n }] } as Record<string, unknown>
  v.self = v
  t.equal(deepFreeze(v), v)
  t.ok(Object.isFrozen(v) && Object.isFrozen(shared) && Object.isFrozen(shared.x) && Object.isFrozen(shared.x[1]))
  t.ok(Object.isFrozen((v.list as object[])[0]))
})
