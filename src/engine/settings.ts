import type { Config } from '../config/load.js'
import { DEFAULT_METHOD_RAILS } from '../protocols/mpp.js'
import type { MppSettings } from './adapters/mpp.js'
import { CardRail, HttpCardProvider, type CardProvider, type Rail } from './rails.js'

/** The payment rails the engine may use: the card rail when a provider is configured, plus any given in code. */
export function railsOf(config: Config, opts: { cardProvider?: CardProvider; rails?: Rail[] }): Map<string, Rail> {
  const rails = new Map<string, Rail>()
  const provider = opts.cardProvider ?? (config.mpp.cardProviderUrl ? new HttpCardProvider(config.mpp.cardProviderUrl, config.mpp.cardProviderKey) : null)
  if (provider) rails.set('card', new CardRail(provider))
  for (const r of opts.rails ?? []) rails.set(r.name, r)
  return rails
}

/** MPP settings from the config: method-to-rail names and rates normalised. */
export function mppSettings(config: Config): MppSettings {
  const methods: Record<string, string> = { ...DEFAULT_METHOD_RAILS }
  for (const [k, v] of Object.entries(config.mpp.methods)) methods[k.toLowerCase()] = v
  const rates: Record<string, string> = {}
  for (const [k, v] of Object.entries(config.mpp.rates)) rates[k.toUpperCase()] = v
  return { methods, rates, paymentEndpointHosts: config.mpp.paymentEndpointHosts, sessionTtlSeconds: config.mpp.sessionTtlSeconds, maxAuthorizationSeconds: config.pay.maxAuthorizationSeconds }
}
