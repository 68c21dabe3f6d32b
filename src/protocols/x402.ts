/**
 * x402, pure: read the offers of a 402 answer (x402/detect.ts), decide which one Paygate
 * can pay (x402/choose.ts), build the EIP-712 data to sign and encode the payment headers
 * (x402/payment.ts, x402/digest.ts); read the settlement header of the paid answer
 * (x402/settlement.ts). No sockets, no storage, no keys. This file is their one entry.
 *
 * Four wire shapes are read (verified against x402@1.2.0, x402-express@1.2.0 and
 * @x402/core, @x402/evm, @x402/express 2.27.0):
 * - `x402-v1`: body `{x402Version:1, error, accepts:[{scheme, network, maxAmountRequired,
 *   resource, description, mimeType, payTo, maxTimeoutSeconds, asset, extra}]}`;
 *   paid with `X-PAYMENT: base64(JSON {x402Version:1, scheme, network,
 *   payload:{signature, authorization}})`; answered with `X-PAYMENT-RESPONSE`.
 * - `x402-v2`: header `PAYMENT-REQUIRED: base64(JSON {x402Version:2, error,
 *   resource:{url,...}, accepts:[{scheme, network:"eip155:<id>", amount, asset, payTo,
 *   maxTimeoutSeconds, extra}], extensions?})`, body `{}`; paid with
 *   `PAYMENT-SIGNATURE: base64(JSON {x402Version:2, payload:{authorization, signature},
 *   extensions?, resource, accepted})` where `accepted` must deep-equal the offered entry;
 *   answered with `PAYMENT-RESPONSE`.
 * - `spec-simple`: body `{scheme, network, token, amount, payTo, resource}`.
 * - `spec-accepts`: body `{accepts:[{scheme, network, maxAmountRequired, resource,
 *   description, mimeType, payToAddress, requiredDeadlineSeconds, asset, extra}]}`.
 *   Both spec shapes are paid with `X-PAYMENT: base64(JSON {scheme, network,
 *   payload:{from,to,amount,token,nonce,validAfter,validBefore}, signature})` plus
 *   `X-PAYMENT-SIGNATURE: <signature>`.
 */
export { isPayable, namesChain, networkChainId, sameOrigin, choose, X402_V1_NETWORKS } from './x402/choose.js'
export { detectX402 } from './x402/detect.js'
export { typedDataDigest } from './x402/digest.js'
export { authorizationFor, authorizationJson, paymentHeaders, TRANSFER_WITH_AUTHORIZATION_TYPES, type TransferWithAuthorizationTypedData, transferTypedData, typedData } from './x402/payment.js'
export { readSettlement } from './x402/settlement.js'
export { DEFAULT_TIMEOUT_SECONDS, decodeBase64Json, encodeBase64Json, parseAmount, type X402Shape } from './x402/wire.js'
