import { createServer } from 'node:net'

/** A loopback port free at the time of asking (a throwaway cluster or chain binds it next). */
export async function freePort(): Promise<number> {
  const s = createServer()
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r))
  const port = (s.address() as { port: number }).port
  await new Promise((r) => s.close(r))
  return port
}
