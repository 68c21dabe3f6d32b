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

/**
 * stdout, written once per event-loop turn: under load the lines of many requests share one
 * write (a write per line cost ~8% of a proxied request's CPU). Lines wait at most until the
 * loop comes round, and whatever is held is written on exit.
 */
class TurnBatchedStdout implements DestinationStream {
  private held = ''
  private scheduled = false
  private readonly out = pino.destination({ dest: 1, sync: true })

  constructor() {
    process.on('exit', this.flush)
  }

  write(line: string): void {
    this.held += line
    if (this.scheduled) return
    this.scheduled = true
    setImmediate(this.flush)
  }

  readonly flush = (): void => {
    this.scheduled = false
    const held = this.held
    if (!held) return
    this.held = ''
    this.out.write(held)
  }
}

let stdout: TurnBatchedStdout | undefined

export function createLogger(level: string, destination?: DestinationStream): Logger {
  return pino({ ...OPTIONS, level, redact: { paths: REDACT, censor: '[redacted]' } }, destination ?? (stdout ??= new TurnBatchedStdout()))
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

/**
 * A writer for one fixed line shape at info level, for the proxy's line per request: the
 * JSON pino would write (level, time, service, the fields, msg), built directly, without
 * pino's generic serializer (~5% of a proxied request). Fields must carry no secret.
 */
export function infoLine(log: Logger, msg: string): (fields: Record<string, string | number | undefined>) => void {
  const stream = (log as unknown as Record<symbol, DestinationStream>)[pino.symbols.streamSym]!
  const tail = `,"msg":${JSON.stringify(msg)}}\n`
  return (fields) => {
    if (!log.isLevelEnabled('info')) return
    let line = `{"level":"info"${isoTime()},"service":"paygate"`
    for (const k in fields) {
      const v = fields[k]
      if (v !== undefined) line += `,"${k}":${typeof v === 'number' ? v : JSON.stringify(v)}`
    }
    stream.write(line + tail)
  }
}
