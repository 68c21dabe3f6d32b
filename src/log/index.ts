import { pino, type DestinationStream, type Logger } from 'pino'

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

export function createLogger(level: string, destination?: DestinationStream): Logger {
  return pino(
    {
      level,
      base: { service: 'paygate' },
      timestamp: pino.stdTimeFunctions.isoTime,
      redact: { paths: REDACT, censor: '[redacted]' },
      formatters: { level: (label) => ({ level: label }) },
    },
    destination ?? pino.destination({ dest: 1, sync: true }),
  )
}
