import { isIP } from 'node:net'

/** A listen that failed on a taken address, naming the config key: the default ports may be held by another local service (the embedded chain's default is 18545, not 8545, which every local anvil and Hardhat node takes). */
export const portTaken = (key: string, host: string, port: number): Error =>
  new Error(`${key} = ${port}: ${host}:${port} is already in use (EADDRINUSE); stop what holds it or choose another port (0 picks a free one)`)

/** A bind address only this machine can reach: `localhost`, 127.0.0.0/8 or ::1. */
export const isLoopback = (host: string): boolean => host === 'localhost' || (isIP(host) !== 0 && /^(127\.|::1$)/.test(host))
