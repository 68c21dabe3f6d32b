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

/** Texts hidden wherever they appear in a log line, longest first, with what is shown instead. */
let hidden: [text: string, shown: string][] = []

/**
 * Hide `text` in every line the loggers of `createLogger` write, and in `scrubSecrets`:
 * the second line of defence for a secret inside a message (an RPC URL with its API key in
 * a library's error). Configured secrets are registered once, at start.
 */
export function hideInLogs(text: string, shown = '[redacted]'): void {
  if (!text || hidden.some(([t]) => t === text)) return
  hidden = [...hidden, [text, shown] as [string, string]].sort((a, b) => b[0].length - a[0].length)
}

/** `text` with every hidden text replaced. */
export function scrubSecrets(text: string): string {
  for (const [t, shown] of hidden) if (text.includes(t)) text = text.replaceAll(t, shown)
  return text
}

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

const BASE = { service: 'paygate' }

const OPTIONS: LoggerOptions = {
  base: BASE,
  timestamp: isoTime,
  formatters: { level: (label) => ({ level: label }) },
}

/**
 * stdout, written in batches: at most every FLUSH_MS, or at once past MAX_HELD. Under load
 * the lines of hundreds of requests share one write (a write per line cost ~8% of a proxied
 * request's CPU, and each write to a pipe wakes its reader). Whatever is held is written
 * on exit; a SIGKILL loses at most the last FLUSH_MS of lines.
 */
const FLUSH_MS = 10
const MAX_HELD = 64 * 1024

class BatchedStdout implements DestinationStream {
  private held = ''
  private timer: NodeJS.Timeout | null = null
  private readonly out = pino.destination({ dest: 1, sync: true })

  constructor() {
    process.on('exit', this.flush)
  }

  write(line: string): void {
    this.held += line
    if (this.held.length >= MAX_HELD) this.flush()
    else if (!this.timer) this.timer = setTimeout(this.flush, FLUSH_MS).unref()
  }

  readonly flush = (): void => {
    if (this.timer) clearTimeout(this.timer)
    this.timer = null
    const held = this.held
    if (!held) return
    this.held = ''
    this.out.write(held)
  }
}

let stdout: BatchedStdout | undefined

export function createLogger(level: string, destination?: DestinationStream): Logger {
  return pino({ ...OPTIONS, level, redact: { paths: REDACT, censor: '[redacted]' }, hooks: { streamWrite: scrubSecrets } }, destination ?? (stdout ??= new BatchedStdout()))
}

const streamOf = (log: Logger): DestinationStream => (log as unknown as Record<symbol, DestinationStream>)[pino.symbols.streamSym]!

/**
 * A logger on the same destination and level without the redaction pass (nor `hideInLogs`), for a hot-path
 * line whose fields are all known and carry no secret (the API's line per request):
 * redaction walks every object logged (about 11 µs a line here, 5 µs for all the rest).
 */
export function unredacted(log: Logger): Logger {
  return pino({ ...OPTIONS, level: log.level }, streamOf(log))
}

/**
 * A writer for one fixed line shape at info level, for the proxy's line per request: the
 * JSON pino would write (level, time, service, the fields, msg), built directly, without
 * pino's generic serializer (~5% of a proxied request). Fields must carry no secret.
 */
export function infoLine(log: Logger, msg: string): (fields: Record<string, string | number | undefined>) => void {
  const stream = streamOf(log)
  const base = `,${JSON.stringify(BASE).slice(1, -1)}`
  const tail = `,"msg":${JSON.stringify(msg)}}\n`
  return (fields) => {
    if (!log.isLevelEnabled('info')) return
    let line = `{"level":"info"${isoTime()}${base}`
    for (const k in fields) {
      const v = fields[k]
      if (v !== undefined) line += `,"${k}":${typeof v === 'number' ? v : JSON.stringify(v)}`
    }
    stream.write(line + tail)
  }
}
