import { PaygateError, RequestTimeoutError } from './index.js'

/**
 * Where Node's bare answer to a refused request has a status of its own, it is kept: 413 is
 * our `payload_too_large`; 431 and 408 have no code of ours, so their body says
 * `invalid_request`. Anything else the parser refuses is 400 `invalid_request`.
 */
const PARSER_ERRORS: Record<string, { status: number; error: PaygateError }> = {
  HPE_HEADER_OVERFLOW: { status: 431, error: new PaygateError('invalid_request', 'request headers are too large') },
  HPE_CHUNK_EXTENSIONS_OVERFLOW: { status: 413, error: new PaygateError('payload_too_large', 'chunk extensions are too large') },
  ERR_HTTP_REQUEST_TIMEOUT: { status: 408, error: new RequestTimeoutError() },
}

/** The status and error body for a request Node's HTTP parser refused (its `clientError`). */
export function parserRefusal(e: NodeJS.ErrnoException & { reason?: string }): { status: number; error: PaygateError } {
  return PARSER_ERRORS[e.code ?? ''] ?? { status: 400, error: new PaygateError('invalid_request', `malformed HTTP request: ${e.reason ?? e.message}`) }
}
