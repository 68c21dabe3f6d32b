import { brotliDecompressSync, gunzipSync, inflateRawSync, inflateSync } from 'node:zlib'

/**
 * Content codings undone for an answer Paygate reads itself (`POST /v1/pay`'s `data`); the
 * proxy forwards bodies encoded as they came. Not undici's decompress interceptor: it has no
 * raw-DEFLATE fallback, also decodes `compress` and coding lists (left as they are here),
 * and prints an ExperimentalWarning on first use.
 */
type Decoder = (b: Buffer, o: { maxOutputLength: number }) => Buffer

/** `deflate` is zlib-wrapped by the standard, but some servers send raw DEFLATE under that name. */
function inflateEither(b: Buffer, o: { maxOutputLength: number }): Buffer {
  try {
    return inflateSync(b, o)
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'Z_DATA_ERROR') throw e
    return inflateRawSync(b, o)
  }
}

const DECODERS: Readonly<Record<string, Decoder>> = { gzip: gunzipSync, 'x-gzip': gunzipSync, deflate: inflateEither, br: brotliDecompressSync }

export type Decoded = { data: Buffer } | { failure: 'too_large' | 'undecodable'; message: string }

/** `body` with its content coding undone, at most `max` bytes decoded; an unknown coding is left as it is. */
export function decodeContent(body: Buffer, coding: string | string[] | undefined, max: number): Decoded {
  const decode =
    DECODERS[
      String(coding ?? '')
        .trim()
        .toLowerCase()
    ]
  if (!decode) return { data: body }
  try {
    return { data: decode(body, { maxOutputLength: max }) }
  } catch (e) {
    return { failure: (e as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE' ? 'too_large' : 'undecodable', message: (e as Error).message }
  }
}
