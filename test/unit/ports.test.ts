import t from 'tap'
import { isLoopback, portTaken } from '../../src/util/ports.js'

t.test('loopback bind addresses', async (t) => {
  for (const h of ['localhost', '127.0.0.1', '127.1.2.3', '::1']) t.ok(isLoopback(h), h)
  for (const h of ['0.0.0.0', '::', '10.0.0.1', '192.168.1.2', 'example.com', '128.0.0.1']) t.notOk(isLoopback(h), h)
})

t.test('a taken port names its key and what to do', async (t) => {
  t.equal(portTaken('chain.rpcPort', '127.0.0.1', 8545).message, 'chain.rpcPort = 8545: 127.0.0.1:8545 is already in use (EADDRINUSE); stop what holds it or choose another port (0 picks a free one)')
})
