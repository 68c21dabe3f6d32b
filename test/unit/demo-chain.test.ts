import t from 'tap'
import { refuseExternal } from '../../src/demo/target.js'

t.test('the demo refuses an external chain, naming the key that chooses the embedded one', async (t) => {
  t.doesNotThrow(() => refuseExternal({ embedded: true, network: 'paygate-devnet' }))
  t.throws(() => refuseExternal({ embedded: false, network: 'base-mainnet' }), {
    code: 'invalid_config',
    message: /chain is external \(base-mainnet\).*only on the embedded dev chain.*chain\.rpcUrl \(PAYGATE_CHAIN_RPC_URL\)/,
  })
  t.throws(() => refuseExternal({ network: 'evm-5' }), { code: 'invalid_config' }, 'a gateway that does not say: refused')
})
