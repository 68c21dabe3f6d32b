import type { AddressInfo, Server, Socket } from 'node:net'
import type { Test } from 'tap'

/**
 * Listen on 127.0.0.1 on a free port, for the test's lifetime. At teardown the connections
 * still open are cut first: the gateway keeps idle connections to targets, which close()
 * would otherwise wait out. Returns the port.
 */
export async function listenForTest(t: Test, s: Server): Promise<number> {
  const open = new Set<Socket>()
  s.on('connection', (c: Socket) => {
    open.add(c)
    c.once('close', () => open.delete(c))
  })
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r))
  t.teardown(() => {
    for (const c of open) c.destroy()
    return new Promise<void>((r) => s.close(() => r()))
  })
  return (s.address() as AddressInfo).port
}
