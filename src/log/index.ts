import { pino, type DestinationStream, type Logger, type LoggerOptions } from 'pino'

export type { Logger }

/**
 * Structured JSON logs (pino lives only here). Secrets never go into a log call; the
 * redaction list is a second line of defence for fields that could carry one.
 */
const REDACT = [
  'apiKey',
  'accountKey',
  'masterKey',
  'privateKey',
  'secret',
  'authorization',
  '*.apiKey',
  '*.accountKey',
  '*.masterKey',
  '*.privateKey',
  '*.secret',
  '*.authorization',
  'headers.authorization',
  'headers["proxy-authorization"]',
  '*.headers.authorization',
  '*.headers["proxy-authorization"]',
]

let lastMs = 0
let lastTime = ''
/** pino's isoTime, formatted once per millisecond: under load many lines share one. */
function isoTime(): string {
  const now = Date.now()
  if (now !== lastMs) {
    lastMs = now
    lastTime = `,"time":"${new Date(now).toISOString()}"`
  }
  return lastTime
}

const OPTIONS: LoggerOptions = {
  base: { service: 'paygate' },
  timestamp: isoTime,
  formatters: { level: (label) => ({ level: label }) },
}

export function createLogger(level: string, destination?: DestinationStream): Logger {
  return pino({ ...OPTIONS, level, redact: { paths: REDACT, censor: '[redacted]' } }, destination ?? pino.destination({ dest: 1, sync: true }))
}

/**
 * A logger on the same destination and level without the redaction pass, for a hot-path
 * line whose fields are all known and carry no secret (the proxy's line per request):
 * redaction walks every object logged (about 11 µs a line here, 5 µs for all the rest).
 */
export function unredacted(log: Logger): Logger {
  const stream = (log as unknown as Record<symbol, DestinationStream>)[pino.symbols.streamSym]!
  return pino({ ...OPTIONS, level: log.level }, stream)
}
