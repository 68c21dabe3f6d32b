/** Which alert form field an API error's `field` belongs to (`notify.url` → target). */
export function fieldOf(apiField: string | undefined): string {
  if (!apiField) return 'form'
  if (apiField.startsWith('notify.type')) return 'channel'
  if (apiField.startsWith('notify')) return 'target'
  for (const k of ['agentId', 'type', 'threshold', 'window']) if (apiField.startsWith(k)) return k
  return 'form'
}
