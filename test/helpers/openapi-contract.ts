import { readFileSync } from 'node:fs'
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js'
import addFormatsModule from 'ajv-formats'

/**
 * The API contract, docs/openapi.json, as a checker of real answers: find the operation for
 * a method and a concrete path by its path template, then hold the answer to it (its status
 * documented, its content type one the status lists, its body valid against that schema,
 * its required headers there). Every answer checked is recorded as (method, template,
 * status), so a test can compare what it saw with what the document promises.
 */

export const DOC_FILE = new URL('../../docs/openapi.json', import.meta.url)

const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'] as const
const COMPONENTS_ID = 'urn:paygate:openapi:components'

// ajv-formats is CommonJS: under tsx its default export is the plugin or a module holding it.
const addFormats = ((addFormatsModule as { default?: unknown }).default ?? addFormatsModule) as (ajv: Ajv2020) => Ajv2020

export interface Answer {
  status: number
  /** Response headers, lower-case names. */
  headers: Record<string, string | string[] | undefined>
  /** The body as text ('' when there is none). */
  text: string
}

type Json = Record<string, any>

/** One template's segments: a literal, or null for a `{param}`. */
interface Template {
  path: string
  segments: (string | null)[]
  methods: string[]
}

const key = (method: string, path: string, status: string | number): string => `${method.toUpperCase()} ${path} ${status}`

/** Rewrite `#/components/schemas/X` to the components schema's `$defs`, so each schema compiles on its own. */
function relinked(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(relinked)
  if (node === null || typeof node !== 'object') return node
  const out: Json = {}
  for (const [k, v] of Object.entries(node)) {
    if (k === '$ref' && typeof v === 'string') {
      if (!v.startsWith('#/components/schemas/')) throw new Error(`unsupported $ref ${v}`)
      out[k] = `${COMPONENTS_ID}#/$defs/${v.slice('#/components/schemas/'.length)}`
    } else out[k] = relinked(v)
  }
  return out
}

/** The media type of a Content-Type value, lower-case, without parameters. */
export const mediaType = (v: string | string[] | undefined): string | null => (typeof v === 'string' ? v.split(';')[0]!.trim().toLowerCase() : null)

const isJsonType = (t: string): boolean => t === 'application/json' || t.endsWith('+json')

export class Contract {
  readonly doc: Json
  private readonly ajv: Ajv2020
  private readonly templates: Template[]
  private readonly validators = new Map<string, ValidateFunction>()
  /** (METHOD template status) of every answer checked. */
  readonly seen = new Set<string>()

  constructor(doc: Json = JSON.parse(readFileSync(DOC_FILE, 'utf8'))) {
    this.doc = doc
    // Strict: an unknown keyword, a `required` naming no property, a type-less keyword all fail to compile.
    this.ajv = new Ajv2020({ strict: true, strictRequired: true, allowUnionTypes: true, allErrors: true })
    this.ajv.addVocabulary(['example', 'externalDocs', 'xml'])
    addFormats(this.ajv)
    this.ajv.addSchema({ $id: COMPONENTS_ID, $defs: relinked(doc.components?.schemas ?? {}) as Json })
    this.templates = Object.entries(doc.paths as Json).map(([path, item]) => ({
      path,
      segments: path
        .split('/')
        .filter(Boolean)
        .map((s) => (/^\{[^}]+\}$/.test(s) ? null : s)),
      methods: METHODS.filter((m) => item[m]).map((m) => m.toUpperCase()),
    }))
  }

  /** Every (METHOD template status) the document promises. */
  documented(paths?: readonly string[]): Set<string> {
    const out = new Set<string>()
    for (const t of this.templates) {
      if (paths && !paths.includes(t.path)) continue
      for (const m of t.methods) for (const s of Object.keys(this.operation(t.path, m).responses)) out.add(key(m, t.path, s))
    }
    return out
  }

  /** Every (METHOD template) the document has. */
  operations(): { method: string; path: string }[] {
    return this.templates.flatMap((t) => t.methods.map((method) => ({ method, path: t.path })))
  }

  /** The methods documented on a template. */
  methodsOf(path: string): string[] {
    const t = this.templates.find((x) => x.path === path)
    if (!t) throw new Error(`${path} is not in the document`)
    return t.methods
  }

  private operation(path: string, method: string): Json {
    return this.doc.paths[path][method.toLowerCase()]
  }

  /**
   * The template a concrete path (query string allowed) falls under for `method`. As the router
   * matches: a path a more literal template names belongs to it alone (`/v1/agents/invoke` is not
   * `/v1/agents/{agentId}`), so only the most literal matching templates count. `allow` when
   * none of them documents the method.
   */
  find(method: string, concrete: string): { path: string } | { allow: string[] } | null {
    const parts = new URL(concrete, 'http://x').pathname.split('/').filter(Boolean)
    const matching = this.templates.filter((t) => t.segments.length === parts.length && t.segments.every((s, i) => s === null || s === parts[i]))
    if (!matching.length) return null
    // Literal segments as '1', parameters as '0': the greatest string is the most specific (the router's rule).
    const literal = (t: Template): string => t.segments.map((s) => (s === null ? '0' : '1')).join('')
    const best = matching.map(literal).sort().at(-1)
    const top = matching.filter((t) => literal(t) === best)
    const withMethod = top.find((t) => t.methods.includes(method.toUpperCase()))
    if (withMethod) return { path: withMethod.path }
    return { allow: [...new Set(top.flatMap((t) => t.methods))].sort() }
  }

  private validator(path: string, method: string, status: string, media: string, schema: unknown): ValidateFunction {
    const id = `${method} ${path} ${status} ${media}`
    let v = this.validators.get(id)
    if (!v) this.validators.set(id, (v = this.ajv.compile(relinked(schema) as Json)))
    return v
  }

  /**
   * What is wrong with `answer` to `method concrete` by the document: [] when nothing. A 405
   * for a documented path must list exactly its documented methods in Allow.
   */
  check(method: string, concrete: string, answer: Answer): string[] {
    const where = this.find(method, concrete)
    if (where === null) return [`${method} ${concrete}: no documented path matches`]
    if ('allow' in where) {
      const allow = String(answer.headers.allow ?? '')
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
        .sort()
      const problems: string[] = []
      if (answer.status !== 405) problems.push(`${method} ${concrete}: the document has no ${method} here, yet the answer is ${answer.status}, not 405`)
      if (allow.join() !== where.allow.join()) problems.push(`${method} ${concrete}: Allow is [${allow}], the document has [${where.allow}]`)
      return problems.concat(this.errorBody(answer, `${method} ${concrete} 405`))
    }
    const { path } = where
    const label = `${method} ${path} ${answer.status}`
    this.seen.add(key(method, path, answer.status))
    const responses = this.operation(path, method).responses as Json
    const response: Json | undefined = responses[String(answer.status)] ?? responses[`${String(answer.status)[0]}XX`] ?? responses.default
    if (!response) return [`${label}: status ${answer.status} is not documented (documented: ${Object.keys(responses).join(', ')})`]
    const problems: string[] = []
    for (const [name, h] of Object.entries((response.headers ?? {}) as Json)) {
      if (h.required && answer.headers[name.toLowerCase()] === undefined) problems.push(`${label}: required header ${name} is missing`)
    }
    const content = response.content as Json | undefined
    if (!content) {
      if (answer.text !== '') problems.push(`${label}: the document gives no body, the answer has ${answer.text.length} characters`)
      return problems
    }
    const media = mediaType(answer.headers['content-type'])
    if (media === null || !content[media]) return [...problems, `${label}: content type ${media} is not one of ${Object.keys(content).join(', ')}`]
    const schema = content[media].schema
    if (schema === undefined) return problems
    let body: unknown = answer.text
    if (isJsonType(media)) {
      try {
        body = JSON.parse(answer.text)
      } catch {
        return [...problems, `${label}: the ${media} body is not JSON`]
      }
    }
    const v = this.validator(path, method, String(answer.status), media, schema)
    if (!v(body)) for (const e of v.errors ?? []) problems.push(`${label}: body${e.instancePath} ${e.message}${e.params ? ` ${JSON.stringify(e.params)}` : ''}`)
    return problems
  }

  /** The spec's error body, for answers outside any operation (a 405). */
  private errorBody(answer: Answer, label: string): string[] {
    const v = (this.validators.get('Error') ?? this.ajv.compile({ $ref: `${COMPONENTS_ID}#/$defs/Error` })) as ValidateFunction
    this.validators.set('Error', v)
    if (mediaType(answer.headers['content-type']) !== 'application/json') return [`${label}: not JSON`]
    let body: unknown
    try {
      body = JSON.parse(answer.text)
    } catch {
      return [`${label}: the body is not JSON`]
    }
    return v(body) ? [] : (v.errors ?? []).map((e) => `${label}: body${e.instancePath} ${e.message}`)
  }

  /** Every schema of every response compiles (strict mode finds keyword typos and `required` names without a property). */
  compileAll(): void {
    for (const { method, path } of this.operations()) {
      for (const [status, r] of Object.entries(this.operation(path, method).responses as Json)) {
        for (const [media, c] of Object.entries((r.content ?? {}) as Json)) if (c.schema !== undefined) this.validator(path, method, status, media, c.schema)
      }
    }
  }
}

export { key as contractKey }
