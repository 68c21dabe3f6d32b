import * as http from 'node:http'
import type * as net from 'node:net'
import { rpcError } from './methods.js'
import type { RpcRequest, RpcResponse } from './types.js'

/** Serves `handle` as HTTP JSON-RPC (batches too) for merchants, facilitators and wallets. */
export async function serveHttp(handle: (req: RpcRequest) => Promise<RpcResponse>, host: string, port: number): Promise<{ server: http.Server; rpcUrl: string }> {
  const server = http.createServer((req, res) => {
    if (req.method !== 'POST') {
      res.writeHead(req.method === 'OPTIONS' ? 204 : 405, { allow: 'POST' }).end()
      return
    }
    const chunks: Buffer[] = []
    let size = 0
    req.on('data', (c: Buffer) => {
      size += c.length
      if (size > 32 << 20) {
        res.writeHead(413).end()
        req.destroy()
      } else chunks.push(c)
    })
    req.on('end', () => {
      let body: unknown
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'))
      } catch {
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(rpcError(null, -32700, 'parse error')))
        return
      }
      const one = (x: unknown): Promise<RpcResponse> => handle(x as RpcRequest).catch((e: unknown) => rpcError((x as RpcRequest)?.id ?? null, -32603, (e as Error).message))
      const out: Promise<unknown> = Array.isArray(body) ? (body.length ? Promise.all(body.map(one)) : Promise.resolve(rpcError(null, -32600, 'empty batch'))) : one(body)
      void out.then((v) => {
        if (!res.destroyed) res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(v))
      })
    })
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, host, () => {
      server.removeListener('error', reject)
      resolve()
    })
  })
  const bound = (server.address() as net.AddressInfo).port
  return { server, rpcUrl: `http://${host.includes(':') ? `[${host}]` : host}:${bound}` }
}
