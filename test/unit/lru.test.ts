import t from 'tap'
import { deepFreeze, Lru, remembered } from '../../src/util/lru.js'
import { domainOf } from '../../src/policy/domains.js'
import { endpointOf } from '../../src/ledger/transactions.js'
import { sameOrigin } from '../../src/protocols/x402/choose.js'

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

t.test('remembered runs its function once per argument while it is kept; a throw is not kept', async (t) => {
  const calls: string[] = []
  const f = remembered((s: string) => {
    calls.push(s)
    if (s === 'bad') throw new Error('bad input')
    return s.length
  }, 2)
  t.same([f('a'), f('bb'), f('a')], [1, 2, 1])
  t.same(calls, ['a', 'bb'])
  f('ccc') // drops bb, the least recently used
  t.equal(f('bb'), 2)
  t.same(calls, ['a', 'bb', 'ccc', 'bb'])
  t.throws(() => f('bad'), /bad input/)
  t.throws(() => f('bad'), /bad input/)
  t.same(
    calls.filter((c) => c === 'bad'),
    ['bad', 'bad'],
  )
})

t.test('the remembered URL parses answer as before, every time', async (t) => {
  for (let i = 0; i < 2; i++) {
    t.equal(domainOf('https://API.Example.com./x?y=1'), 'api.example.com')
    t.throws(() => domainOf('not a url'))
    t.equal(endpointOf('http://127.0.0.1:8080/paid?q=1#h'), 'http://127.0.0.1:8080/paid')
    t.equal(endpointOf('not a url'), 'not a url')
    t.equal(sameOrigin({ resource: null }, 'https://a.example/x'), true)
    t.equal(sameOrigin({ resource: '/x' }, 'https://a.example/y'), true)
    t.equal(sameOrigin({ resource: 'https://b.example/x' }, 'https://a.example/y'), false)
    t.equal(sameOrigin({ resource: 'http://a.example:8443/x' }, 'https://a.example:8443/y'), true)
    // The same text split differently between resource and request URL is another pair.
    t.equal(sameOrigin({ resource: 'https://a.example/' }, 'https://b.example/'), false)
    t.equal(sameOrigin({ resource: null }, 'not a url'), false)
  }
})

t.test('Lru agrees with a reference LRU (a Map re-inserted on each use) over random uses', async (t) => {
  for (const max of [1, 2, 3, 8, 64]) {
    const c = new Lru<number, number>(max)
    const ref = new Map<number, number>()
    const touch = (k: number, v: number) => {
      ref.delete(k)
      ref.set(k, v)
      if (ref.size > max) ref.delete(ref.keys().next().value!)
    }
    let same = true
    for (let i = 0; i < 20_000 && same; i++) {
      const k = Math.floor(Math.random() * max * 2)
      if (Math.random() < 0.5) {
        c.set(k, i)
        touch(k, i)
      } else {
        const want = ref.get(k)
        if (want !== undefined) touch(k, want)
        same = c.get(k) === want
      }
      same &&= c.size === ref.size
    }
    t.ok(same, `max ${max}: every read and size as the reference's`)
  }
})
