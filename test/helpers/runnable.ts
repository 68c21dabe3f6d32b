/**
 * Runnable doc blocks (convention in docs/docs-that-run.md): a fenced `sh` block whose
 * fence is directly preceded by a `<!-- runnable -->` line, optionally
 * `<!-- runnable expect=/regex/ -->`: the block's output must match the regex.
 */
export interface RunnableBlock {
  /** 1-based line of the opening fence. */
  line: number
  code: string
  expect: RegExp | null
}

const MARKER = /^<!--\s*runnable(?:\s+expect=\/(.*)\/([a-z]*))?\s*-->\s*$/

export function runnableBlocks(markdown: string): RunnableBlock[] {
  const lines = markdown.split('\n')
  const out: RunnableBlock[] = []
  for (let i = 1; i < lines.length; i++) {
    if (!/^```sh\s*$/.test(lines[i]!)) continue
    const m = MARKER.exec(lines[i - 1]!.trim())
    if (!m) continue
    const end = lines.findIndex((l, j) => j > i && /^```\s*$/.test(l))
    if (end < 0) throw new Error(`runnable block at line ${i + 1} is not closed`)
    out.push({ line: i + 1, code: lines.slice(i + 1, end).join('\n'), expect: m[1] === undefined ? null : new RegExp(m[1], m[2]) })
    i = end
  }
  return out
}
