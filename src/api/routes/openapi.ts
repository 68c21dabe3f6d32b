import { readFileSync } from 'node:fs'
import type { Route } from '../router.js'

/** docs/openapi.json, from src/api/routes/ and from dist/api/routes/ alike. */
const DOCUMENT = new URL('../../../docs/openapi.json', import.meta.url)

/** `GET /v1/openapi.json`: the API's OpenAPI 3.1 document (public: a client is written from it before it has a key). */
export function openapiRoutes(): Route[] {
  let text: string | undefined
  return [
    {
      method: 'GET',
      path: '/v1/openapi.json',
      access: 'public',
      // Read on first use and kept: the document ships with the code it describes.
      handler: async () => ({ status: 200, raw: { contentType: 'application/json; charset=utf-8', data: (text ??= readFileSync(DOCUMENT, 'utf8')) } }),
    },
  ]
}
