/**
 * The passthrough benchmarks' target, run as its own process (as a real target would be, and
 * so the benchmark's own work, such as draining Paygate's log pipe, never slows it): answers
 * every request `200 ok`. Prints `{"url": ...}` once listening on 127.0.0.1.
 */
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'

const server = createServer((_req, res) => {
  res.writeHead(200, { 'content-type': 'text/plain', 'content-length': 2 })
  res.end('ok')
})
server.keepAliveTimeout = 60_000
server.listen(0, '127.0.0.1', () => process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/` })}\n`))
process.on('SIGTERM', () => {
  server.closeAllConnections()
  server.close(() => process.exit(0))
})
