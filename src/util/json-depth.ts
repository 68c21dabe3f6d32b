/**
 * How deeply the arrays and objects of a JSON text nest (`1` is `{}` or `[1]`, 0 a scalar),
 * counted in one pass without recursion, so any depth is safe to measure. Brackets inside
 * strings do not count. Meant for text JSON.parse accepted: on other text the count is
 * still bounded by the text's length and means little.
 */
export function jsonDepth(text: string): number {
  let depth = 0
  let max = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 0x5c)
        i++ // a backslash escapes the next character
      else if (c === 0x22) inString = false
    } else if (c === 0x22) inString = true
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) max = depth
    } else if (c === 0x5d || c === 0x7d) depth--
  }
  return max
}
