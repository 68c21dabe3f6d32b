import { Readable } from 'node:stream'

/** Why a stream closed before its end: its error, or the early close itself. */
const closedEarly = (stream: Readable): Error => stream.errored ?? new Error('the stream was closed before it ended')

/**
 * Read a stream into one buffer, failing with `tooLarge()` (and destroying the stream) past
 * `max` bytes.
 */
export async function collect(stream: Readable, max: number, tooLarge: () => Error, expectedBytes?: number, deadline?: Deadline): Promise<Buffer> {
  const { head, rest } = await collectUpTo(stream, max, expectedBytes, deadline)
  if (!rest) return head
  rest.destroy()
  throw tooLarge()
}

/**
 * Read a stream up to about `max` bytes without giving up the rest: all of it (`rest` null),
 * or the chunks read until past `max` and the paused stream (`rest`) to be read on, e.g.
 * to pass a large answer through after looking at its start. Listens for data and end
 * directly: an async iterator costs several promise hops per body, and every paid call reads
 * three small bodies on its critical path.
 */
/** A limit on the whole read (a body dripped a byte at a time passes every per-chunk timeout): past `ms` the stream is destroyed with `error()`. */
export interface Deadline {
  ms: number
  error(): Error
}

export function collectUpTo(stream: Readable, max: number, expectedBytes?: number, deadline?: Deadline): Promise<{ head: Buffer; rest: Readable | null }> {
  if (stream.readableEnded) return Promise.resolve({ head: Buffer.alloc(0), rest: null })
  const whole = takeWhole(stream, max, expectedBytes)
  if (whole) return Promise.resolve({ head: whole, rest: null })
  if (stream.destroyed) {
    stream.once('error', () => {})
    return Promise.reject(closedEarly(stream))
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    const timer = deadline ? setTimeout(() => stream.destroy(deadline.error()), deadline.ms) : null
    const stop = (): void => {
      if (timer) clearTimeout(timer)
      stream.off('data', onData)
      stream.off('end', onEnd)
      stream.off('error', onError)
      stream.off('close', onClose)
    }
    const onData = (c: Buffer): void => {
      chunks.push(c)
      size += c.length
      if (size <= max) return
      stop()
      stream.pause()
      resolve({ head: Buffer.concat(chunks, size), rest: stream })
    }
    const onEnd = (): void => {
      stop()
      resolve({ head: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size), rest: null })
    }
    const onError = (e: Error): void => {
      stop()
      reject(e)
    }
    const onClose = (): void => {
      stop()
      reject(closedEarly(stream))
    }
    stream.on('data', onData)
    stream.on('end', onEnd)
    stream.on('error', onError)
    stream.on('close', onClose)
  })
}

/**
 * A body that is already all here, taken in one read(): a message that is `complete` (an
 * IncomingMessage, or an upstream response body), or whose buffered bytes are all it was
 * said to carry (`expectedBytes`, its Content-Length). Saves the turns of 'data' and 'end'
 * events. The stream is then resumed, so it still ends and closes as it would have.
 */
function takeWhole(stream: Readable, max: number, expectedBytes: number | undefined): Buffer | null {
  const n = stream.readableLength
  if (n === 0 || n > max || stream.readableFlowing || stream.destroyed || stream.readableObjectMode || stream.readableEncoding !== null) return null
  if ((stream as { complete?: unknown }).complete !== true && n !== expectedBytes) return null
  const head = stream.read() as Buffer | null
  if (!head || head.length !== n) {
    // Not what was buffered after all: give it back and read the usual way.
    if (head) stream.unshift(head)
    return null
  }
  stream.resume()
  return head
}

/**
 * The bytes already read (`head`, from collectUpTo), then the rest of the stream, as one
 * stream; destroying it early also destroys `rest` (an upstream body left paused).
 */
export function headThen(head: Buffer, rest: Readable): Readable {
  const out = Readable.from(
    (async function* (): AsyncGenerator<Buffer> {
      yield head
      yield* rest
    })(),
  )
  out.once('close', () => {
    if (!rest.destroyed) rest.destroy()
  })
  return out
}

/**
 * Read the rest of a stream and drop it, up to `max` bytes: true once it ended, false when it
 * went past `max` or broke off first (then it is left paused). Lets a refused request's body
 * arrive in full, so the answer is not lost to the reset that closing on unread bytes brings.
 */
export function discard(stream: Readable, max: number): Promise<boolean> {
  if (stream.readableEnded) return Promise.resolve(true)
  if (stream.destroyed) return Promise.resolve(false)
  return new Promise((resolve) => {
    let size = 0
    const stop = (ended: boolean): void => {
      stream.off('data', onData)
      stream.off('end', onEnd)
      stream.off('error', onFail)
      stream.off('close', onFail)
      resolve(ended)
    }
    const onData = (c: Buffer): void => {
      size += c.length
      if (size <= max) return
      stream.pause()
      stop(false)
    }
    const onEnd = (): void => stop(true)
    const onFail = (): void => stop(false)
    stream.on('data', onData)
    stream.on('end', onEnd)
    stream.on('error', onFail)
    stream.on('close', onFail)
    stream.resume()
  })
}
