declare module 'parse-prometheus-text-format' {
  export interface PromSample {
    labels?: Record<string, string>
    value?: string
    buckets?: Record<string, string>
    count?: string
    sum?: string
  }
  export interface PromFamily {
    name: string
    help: string
    type: 'COUNTER' | 'GAUGE' | 'HISTOGRAM' | 'SUMMARY' | 'UNTYPED'
    metrics: PromSample[]
  }
  export default function parsePrometheusTextFormat(text: string): PromFamily[]
}
