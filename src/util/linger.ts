import type { Duplex } from 'node:stream'

/** How long a refused connection is read after its answer, at most, before it is cut. */
export const LINGER_MS = 2_000

/**
 * Send a last answer (if not sent already) and close without losing it: the answer and our FIN go out, then what
 * the client still sends (the rest of an oversized head or body) is read and dropped until it
 * closes its side, for at most `ms`. Closing at once with unread bytes makes the kernel send
 * a TCP reset, which can destroy the answer before the client reads it.
 */
export function endLingering(socket: Duplex, answer?: string | Buffer, ms = LINGER_MS): void {
  const cut = (): void => {
    clearTimeout(timer)
    socket.destroy()
  }
  const timer = setTimeout(cut, ms)
  timer.unref()
  socket.once('end', cut)
  socket.once('close', () => clearTimeout(timer))
  socket.on('data', () => {})
  if (answer === undefined) socket.end()
  else socket.end(answer)
  socket.resume()
}
