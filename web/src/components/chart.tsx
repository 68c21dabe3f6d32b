import { useEffect, useRef } from 'preact/hooks'
import uPlot from 'uplot'
import 'uplot/dist/uPlot.min.css'

/** The metrics API's spend series `[{t, usdc}]` as a line chart, with the numbers in a table for screen readers. */
export function SpendChart({ series }: { series: { t: string | number; usdc: number | string }[] }) {
  const box = useRef<HTMLDivElement>(null)
  useEffect(() => {
    const el = box.current
    if (!el) return
    const xs = series.map((p) => (typeof p.t === 'number' ? p.t : Date.parse(p.t)) / 1000)
    const ys = series.map((p) => Number(p.usdc))
    const width = Math.max(240, el.clientWidth)
    const plot = new uPlot(
      {
        width,
        height: 180,
        series: [{}, { label: 'USDC', stroke: '#1d4ed8', width: 2, fill: 'rgba(29,78,216,0.1)' }],
        axes: [{}, { label: 'USDC' }],
        // From zero, and 0-1 USDC with no spend (uPlot's own range for all zeros is 0-100).
        scales: { y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1] } },
        legend: { show: false },
      },
      [xs, ys],
      el,
    )
    // Follow the card's width (a phone turned, a window resized): the canvas never overflows it.
    const resize = new ResizeObserver(() => plot.setSize({ width: Math.max(240, el.clientWidth), height: 180 }))
    resize.observe(el)
    return () => {
      resize.disconnect()
      plot.destroy()
    }
  }, [series])
  return (
    <figure class="chart">
      <div ref={box} aria-hidden="true" />
      <figcaption class="sr-only">
        Spend per interval:{' '}
        {series
          .filter((p) => Number(p.usdc) > 0)
          .map((p) => `${new Date(typeof p.t === 'number' ? p.t : Date.parse(p.t)).toLocaleTimeString()}: ${p.usdc} USDC`)
          .join('; ') || 'none'}
      </figcaption>
    </figure>
  )
}
