import type { Server } from 'node:http'
import type { AddressInfo, Server as NetServer } from 'node:net'
import { portTaken } from './ports.js'

/** A bind address that does not resolve, or is not this machine's. */
const BAD_HOST = new Set(['ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL'])

const hostUnusable = (portKey: string, host: string, e: NodeJS.ErrnoException): Error =>
  new Error(`${portKey.replace(/port$/i, (m) => (m[0] === 'P' ? 'Host' : 'host'))} = ${host}: cannot listen there (${e.code}): use an address of this machine, e.g. 127.0.0.1 or 0.0.0.0`)

/** Listen, naming the config key when the address is taken, or the host key (`api.host` beside `api.port`) when the host cannot be bound. */
export function listen(server: NetServer, port: number, host: string, key: string): Promise<AddressInfo> {
  return new Promise((resolve, reject) => {
    const failed = (e: NodeJS.ErrnoException): void => reject(e.code === 'EADDRINUSE' ? portTaken(key, host, port) : BAD_HOST.has(e.code ?? '') ? hostUnusable(key, host, e) : e)
    server.once('error', failed)
    server.listen(port, host, () => {
      server.off('error', failed)
      resolve(server.address() as AddressInfo)
    })
  })
}

export const urlOf = (a: AddressInfo): string => `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`

/** Graceful close: stop accepting, let in-flight requests finish within `graceMs`, then cut. */
export async function closeServer(server: Server, graceMs: number): Promise<void> {
  if (!server.listening) return
  const closed = new Promise<void>((resolve) => server.close(() => resolve()))
  server.closeIdleConnections()
  const timer = setTimeout(() => server.closeAllConnections(), graceMs)
  await closed
  clearTimeout(timer)
}
