import { request } from 'undici'

/**
 * A JSON POST to a service the operator configured (a card provider), on undici's global
 * dispatcher: not agent traffic, so not through the egress guard. Throws when the service
 * cannot be reached; `json` is null when the answer is not JSON.
 */
export async function postJson(url: string, headers: Record<string, string>, body: string, timeoutMs: number): Promise<{ status: number; json: unknown }> {
  const res = await request(url, { method: 'POST', headers, body, headersTimeout: timeoutMs, bodyTimeout: timeoutMs })
  return { status: res.statusCode, json: await res.body.json().catch(() => null) }
}
